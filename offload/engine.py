"""The offload engine: one device, its ledger, a strategy, the plan, the hooks and the log."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import cast

import torch

from offload.errors import ModelTooLargeError, OffloadOutOfMemoryError, StrategyError
from offload.hook import OffloadHook, check_no_foreign_hook, install_hook, remove_hook
from offload.ledger import ResidencyLedger
from offload.log import OffloadDecision, OffloadLog
from offload.next_use import NextUseStrategy
from offload.plan import ExecutionPlan
from offload.probes import MemoryProbe, resolve_probe
from offload.simulated import SimulatedDevice
from offload.strategy import OffloadRequest, SupportsSelectVictims
from offload.units import format_bytes, parse_bytes

__all__ = ["OffloadEngine"]

logger = logging.getLogger(__name__)


def _check_strategy(strategy: object) -> SupportsSelectVictims:
    if not callable(getattr(strategy, "select_victims", None)):
        msg = (
            f"offload strategy must have a select_victims(request) method (got {strategy!r} that is a "
            f"{type(strategy)}). Subclass offload.OffloadStrategy, or use NextUseStrategy(), "
            "SmallestSufficientSet() or LRUStrategy()."
        )
        raise TypeError(msg)
    return cast(SupportsSelectVictims, strategy)  # checked just above


class OffloadEngine:
    """Moves attached models onto one device when they run, evicting others as the strategy decides.

    Args:
        device: None (CUDA if available), ``"cuda"``, ``"cuda:0"``, a ``torch.device``, ``"cpu"``
            (no-op placement: every model is resident on the host), or a ``SimulatedDevice``.
        memory_reserve_margin: Bytes (or ``"3GB"``) kept free for activations.
        strategy: Picks victims; defaults to ``NextUseStrategy()``. Kept until ``set_strategy``.
    """

    def __init__(
        self,
        device: str | torch.device | MemoryProbe | None = None,
        memory_reserve_margin: int | str = "3GB",
        strategy: object | None = None,
    ):
        self._probe = resolve_probe(device)
        self._margin = parse_bytes(memory_reserve_margin, name="memory_reserve_margin")
        self._strategy: SupportsSelectVictims = (
            _check_strategy(strategy) if strategy is not None else NextUseStrategy()
        )
        self._ledger = ResidencyLedger(self._probe)
        self._hooks: dict[str, OffloadHook] = {}
        self._plan = ExecutionPlan()
        self._recent_plans: deque[tuple[str, ...]] = deque(maxlen=32)
        self._clock = itertools.count(1)
        self._last_used: dict[str, int] = {}
        self._running: Counter[str] = Counter()  # models inside a forward: never evicted
        self._lock = threading.RLock()
        self.log = OffloadLog()

    def __repr__(self) -> str:
        return (
            f"OffloadEngine(device={self._probe.name!r}, memory_reserve_margin={format_bytes(self._margin)!r}, "
            f"strategy={self._strategy!r}, models={len(self._hooks)}, resident={self.resident_ids()})"
        )

    # -- settings ------------------------------------------------------------------------------
    @property
    def probe(self) -> MemoryProbe:
        """The memory probe of the execution device."""
        return self._probe

    @property
    def execution_device(self) -> torch.device:
        """Where forwards run (the CPU for a ``SimulatedDevice``)."""
        return self._probe.execution_device

    @property
    def memory_reserve_margin(self) -> int:
        """Bytes kept free beyond the weights."""
        return self._margin

    @memory_reserve_margin.setter
    def memory_reserve_margin(self, value: int | str) -> None:
        self._margin = parse_bytes(value, name="memory_reserve_margin")

    @property
    def strategy(self) -> SupportsSelectVictims:
        """The strategy that picks victims."""
        return self._strategy

    def set_strategy(self, strategy: object) -> None:
        """Use ``strategy`` from now on (any object with ``select_victims(request)``)."""
        self._strategy = _check_strategy(strategy)

    def set_plan(self, model_ids: Sequence[str]) -> None:
        """Set the upcoming uses of one pipeline call, in order, loop bodies once.

        The same plan set again keeps what was learned about its loops.
        """
        model_ids = tuple(model_ids)
        bad = [m for m in model_ids if not isinstance(m, str)]
        if bad:
            msg = f"set_plan takes model ids (strings); got {bad!r}. Map objects to ids first."
            raise TypeError(msg)
        with self._lock:
            loops = self._plan.loops if model_ids == self._plan.model_ids else set()
            self._plan = ExecutionPlan(model_ids)
            self._plan.loops = loops
            if model_ids:
                self._recent_plans.append(model_ids)

    # -- attach / detach -----------------------------------------------------------------------
    def attach(self, model_id: str, module: torch.nn.Module) -> None:
        """Hook ``module`` under ``model_id`` and keep its weights on the host copy. Idempotent per id.

        Raises:
            TypeError: ``module`` is not a ``torch.nn.Module``.
            ValueError: the id is attached to another module, the module is attached under another id,
                or it already carries a foreign accelerate hook.
        """
        if not isinstance(module, torch.nn.Module):
            msg = f"attach({model_id!r}, ...) needs a torch.nn.Module (got {type(module)})."
            raise TypeError(msg)
        with self._lock:
            if model_id in self._hooks:
                if self._ledger.module(model_id) is module:
                    return
                msg = f"model id {model_id!r} is already attached to another module; detach({model_id!r}) first."
                raise ValueError(msg)
            other = next((m for m in self._hooks if self._ledger.module(m) is module), None)
            if other is not None:
                msg = f"this module is already attached as {other!r}; one module can be attached under one id only."
                raise ValueError(msg)
            check_no_foreign_hook(module, model_id)  # before anything moves
            hook = OffloadHook(self, model_id)
            moved_back = self._ledger.add(model_id, module)
            try:
                install_hook(module, hook)
            except Exception:
                self._ledger.remove(model_id)
                raise
            self._hooks[model_id] = hook
            if moved_back:
                self._record(model_id, (), 0, moved_back, self._probe.free_bytes(), "attach")

    def detach(self, model_id: str) -> None:
        """Remove ``model_id``'s hook; its weights end on the host copy.

        Raises:
            KeyError: ``model_id`` is not attached.
        """
        with self._lock:
            if model_id not in self._hooks:
                msg = f"model id {model_id!r} is not attached; attached: {sorted(self._hooks)}."
                raise KeyError(msg)
            module = self._ledger.module(model_id)
            was_resident = self._ledger.is_resident(model_id)
            self._ledger.remove(model_id)
            remove_hook(module)
            del self._hooks[model_id]
            self._last_used.pop(model_id, None)
            if was_resident and not self._probe.always_resident:
                self._record(model_id, (model_id,), 0, 0, self._probe.free_bytes(), "detach")

    def close(self) -> None:
        """Detach every model: no hooks, every weight on the host."""
        with self._lock:
            for model_id in list(self._hooks):
                self.detach(model_id)

    # -- queries -------------------------------------------------------------------------------
    def is_resident(self, model_id: str) -> bool:
        """True if ``model_id`` is attached and on the device now."""
        return self._ledger.is_resident(model_id)

    def has_hook(self, model_id: str) -> bool:
        """True if ``model_id`` is attached (its module carries the offload hook)."""
        return model_id in self._hooks

    def attached_ids(self) -> list[str]:
        """Ids of every attached model."""
        return list(self._hooks)

    def resident_ids(self) -> list[str]:
        """Ids of the models on the device now."""
        return list(self._ledger.residents())

    def nbytes(self, model_id: str) -> int:
        """Size of ``model_id``'s weights in bytes, as the ledger counts it."""
        return self._ledger.nbytes(model_id)

    @property
    def peak_resident_bytes(self) -> int:
        """The most bytes of weights ever resident at once."""
        return self._ledger.peak_resident_bytes

    def device_cell(self, model_id: str) -> str:
        """``"where now(where it runs)"``, e.g. ``"cpu(cuda:0)"`` or ``"cuda:0(cuda:0)"``."""
        where = self._probe.name
        return f"{where if self.is_resident(model_id) else 'cpu'}({where})"

    # -- placement -----------------------------------------------------------------------------
    def _free_after_margin(self) -> tuple[int, int]:
        free = self._probe.free_bytes()
        return free, free - self._margin

    def _too_large(self, model_id: str, nbytes: int, capacity: int, running: int) -> ModelTooLargeError:
        probe = self._probe
        total = probe.total_bytes()
        if isinstance(probe, SimulatedDevice):
            device = f"{probe.name} (budget {format_bytes(probe.budget)})"
        else:
            device = probe.name if total is None else f"{probe.name} (total {format_bytes(total)})"
        running_note = f", {format_bytes(running)} held by models running now" if running else ""
        msg = (
            f"model {model_id!r} needs {format_bytes(nbytes)} but at most {format_bytes(max(capacity, 0))} can "
            f"be made free on {device} with every other model evicted (memory_reserve_margin "
            f"{format_bytes(self._margin)}{running_note}). Use a larger device, a smaller "
            "memory_reserve_margin, or load the model in a smaller dtype or quantized."
        )
        return ModelTooLargeError(msg)

    def ensure_resident(self, model_id: str) -> None:
        """Make ``model_id`` resident, evicting what the strategy picks. What the hook calls.

        Raises:
            KeyError: ``model_id`` is not attached.
            ModelTooLargeError: it cannot fit even with every other model evicted (nothing moved).
            StrategyError: the strategy's victims are invalid or free too little (nothing moved).
        """
        with self._lock:
            if model_id not in self._hooks:
                msg = f"model id {model_id!r} is not attached; attached: {sorted(self._hooks)}."
                raise KeyError(msg)
            if not self._ledger.is_resident(model_id):
                self._place(model_id)
            self._plan.observe(model_id)
            self._last_used[model_id] = next(self._clock)

    def _place(self, model_id: str) -> None:
        nbytes = self._ledger.nbytes(model_id)
        free_before, free = self._free_after_margin()
        victims: list[str] = []
        reason = "fits"
        if nbytes > free:
            residents = self._ledger.residents()
            running = sum(size for m, size in residents.items() if self._running[m])
            evictable = {m: residents[m] for m in sorted(residents, key=lambda m: self._last_used.get(m, 0))}
            evictable = {m: size for m, size in evictable.items() if not self._running[m]}
            if nbytes > free + sum(evictable.values()):
                raise self._too_large(model_id, nbytes, free + sum(evictable.values()), running)
            request = OffloadRequest(
                model_id=model_id,
                nbytes=nbytes,
                free=free,
                residents=evictable,
                upcoming=self._plan.upcoming(model_id) if self._plan else (),
                recent_plans=tuple(self._recent_plans),
                last_used={m: self._last_used.get(m, 0) for m in evictable},
            )
            victims = list(self._strategy.select_victims(request))
            self._check_victims(request, victims)
            reason = f"evict: {getattr(self._strategy, 'name', type(self._strategy).__name__)}"
        self._move_in(model_id, victims, free_before, reason)

    def _check_victims(self, request: OffloadRequest, victims: list[str]) -> None:
        name = getattr(self._strategy, "name", type(self._strategy).__name__)
        unknown = [v for v in victims if v not in request.residents]
        if unknown or len(set(victims)) != len(victims):
            msg = (
                f"strategy {name} returned victims {victims!r} for {request.model_id!r}; each must be one "
                f"of the evictable residents {list(request.residents)} and appear once (bad: {unknown!r})."
            )
            raise StrategyError(msg)
        freed = sum(request.residents[v] for v in victims)
        if freed < request.shortfall:
            msg = (
                f"strategy {name} returned victims {victims!r} freeing {format_bytes(freed)}, but "
                f"{request.model_id!r} needs {format_bytes(request.shortfall)} more free "
                f"({format_bytes(request.nbytes)} wanted, {format_bytes(request.free)} free after the margin)."
            )
            raise StrategyError(msg)

    def _move_in(self, model_id: str, victims: Sequence[str], free_before: int, reason: str) -> None:
        to_host = sum(self._ledger.evict(v) for v in victims)
        to_device = self._ledger.make_resident(model_id)
        self._record(model_id, tuple(victims), to_device, to_host, free_before, reason)
        if victims:
            logger.info("%s: evicted %s to make room for %s", reason, ", ".join(victims), model_id)

    def _record(self, model_id, victims, to_device, to_host, free_before, reason) -> None:
        decision = OffloadDecision(
            time=time.time(),
            model_id=model_id,
            evicted=tuple(victims),
            bytes_to_device=to_device,
            bytes_to_host=to_host,
            free_before=free_before,
            free_after=self._probe.free_bytes(),
            reason=reason,
        )
        self.log.append(decision)

    def evict(self, model_id: str) -> None:
        """Take ``model_id`` off the device now (nothing is copied back)."""
        with self._lock:
            if self._ledger.is_resident(model_id) and not self._probe.always_resident:
                free_before = self._probe.free_bytes()
                to_host = self._ledger.evict(model_id)
                self._record(model_id, (model_id,), 0, to_host, free_before, "evict")

    def refresh_host_copy(self, model_id: str) -> None:
        """Bring ``model_id``'s host copy and size up to date after its weights changed in place."""
        with self._lock:
            free_before = self._probe.free_bytes()
            to_host = self._ledger.refresh(model_id)
            self._record(model_id, (), 0, to_host, free_before, "refresh")

    # -- forward with out-of-memory retry ------------------------------------------------------
    def run_forward(self, model_id: str, forward: Callable, args: tuple, kwargs: dict):
        """Run ``forward``; on out-of-memory evict every other model and run it once more."""
        with self._lock:
            self._running[model_id] += 1  # from here on no other thread may evict it
            if not self._ledger.is_resident(model_id):
                # Another thread evicted it between the hook's placement and this forward.
                self._place(model_id)
        try:
            try:
                return forward(*args, **kwargs)
            except torch.OutOfMemoryError:
                pass  # leave the except block so the failed attempt's tensors can be freed
            self._evict_all_but(model_id)
            try:
                return forward(*args, **kwargs)
            except torch.OutOfMemoryError as error:
                nbytes = self._ledger.nbytes(model_id)
                _, free = self._free_after_margin()
                msg = (
                    f"model {model_id!r} ({format_bytes(nbytes)}) ran out of memory on {self._probe.name} in its "
                    f"forward, and again after every other model was evicted ({format_bytes(free)} free after "
                    f"memory_reserve_margin {format_bytes(self._margin)}). Use smaller inputs (batch, "
                    "resolution), a larger memory_reserve_margin, or a larger device."
                )
                raise OffloadOutOfMemoryError(msg) from error
        finally:
            with self._lock:
                self._running[model_id] -= 1
                if not self._running[model_id]:
                    del self._running[model_id]

    def _evict_all_but(self, model_id: str) -> None:
        with self._lock:
            victims = [m for m in self._ledger.residents() if m != model_id and not self._running[m]]
            free_before = self._probe.free_bytes()
            to_host = sum(self._ledger.evict(v) for v in victims)
            if self._probe.execution_device.type == "cuda":
                torch.cuda.empty_cache()
            self._record(model_id, tuple(victims), 0, to_host, free_before, "oom retry")
