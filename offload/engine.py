"""The offload engine: one device, its ledger, a strategy, the plan, the hooks and the log."""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import torch

from offload import messages
from offload.calls import CallTracker, Waiter
from offload.errors import (
    ModelTooLargeError,
    OffloadDeadlockError,
    OffloadOutOfMemoryError,
    OffloadTimeoutError,
    StrategyError,
)
from offload.hook import OffloadHook, check_no_foreign_hook, install_hook, remove_hook
from offload.ledger import ResidencyLedger
from offload.log import OffloadDecision, OffloadLog
from offload.next_use import NextUseStrategy
from offload.plan import ExecutionPlan
from offload.probes import MemoryProbe, resolve_probe
from offload.storage import module_nbytes
from offload.strategy import OffloadRequest, SupportsSelectVictims
from offload.units import format_bytes, format_bytes_distinct, parse_bytes

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


def _check_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"wait_timeout must be a number of seconds (got {value!r} that is a {type(value)})."
        raise TypeError(msg)
    if not 0 < value < math.inf:
        msg = f"wait_timeout must be a positive, finite number of seconds (got {value!r}). Example: 600."
        raise ValueError(msg)
    return float(value)


class OffloadEngine:
    """Moves attached models onto one device when they run, evicting others as the strategy decides.

    Thread safe. A model is *running* from the start of a hooked call until it returns, in whichever
    thread: it is never evicted then. A call that needs room only running models hold waits until they
    return (at most ``wait_timeout`` seconds, then ``OffloadTimeoutError``); it fails at once when
    waiting cannot help: the room is held by its own thread (``ModelTooLargeError``) or by threads
    all waiting for room themselves (``OffloadDeadlockError``). ``detach`` and ``close`` wait for
    the calls in progress to return.

    Args:
        device: None (CUDA if available), ``"cuda"``, ``"cuda:0"``, a ``torch.device``, ``"cpu"``
            (no-op placement: every model is resident on the host), or a ``SimulatedDevice``.
        memory_reserve_margin: Bytes (or ``"3GB"``) kept free for activations.
        strategy: Picks victims; defaults to ``NextUseStrategy()``. Kept until ``set_strategy``.
        wait_timeout: Seconds a call waits for room held by running models before giving up.
    """

    def __init__(
        self,
        device: str | torch.device | MemoryProbe | None = None,
        memory_reserve_margin: int | str = "3GB",
        strategy: object | None = None,
        wait_timeout: float = 600.0,
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
        self._wait_timeout = _check_timeout(wait_timeout)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified when room may have been freed
        # Models inside a hooked call (never evicted), threads waiting for room, models being detached.
        self._calls = CallTracker(self._changed)
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
        margin = parse_bytes(value, name="memory_reserve_margin")
        with self._changed:
            self._margin = margin
            self._changed.notify_all()

    @property
    def wait_timeout(self) -> float:
        """Seconds a call waits for room held by running models (and ``close`` for calls) before giving up."""
        return self._wait_timeout

    @wait_timeout.setter
    def wait_timeout(self, value: float) -> None:
        self._wait_timeout = _check_timeout(value)

    @property
    def strategy(self) -> SupportsSelectVictims:
        """The strategy that picks victims."""
        return self._strategy

    def set_strategy(self, strategy: object) -> None:
        """Use ``strategy`` from now on (any object with ``select_victims(request)``); a placement in
        progress finishes with the one it started with."""
        checked = _check_strategy(strategy)
        with self._lock:
            self._strategy = checked

    def set_plan(self, model_ids: Sequence[str]) -> None:
        """Set the upcoming uses of one pipeline call, in order, loop bodies once.

        The same plan set again keeps what was learned about its loops.

        Raises:
            TypeError: an id is not a string.
            ModelTooLargeError: a planned model cannot fit on the device even alone; the plan is unchanged
                and nothing moved, so the call fails before any of its models is placed.
        """
        model_ids = tuple(model_ids)
        bad = [m for m in model_ids if not isinstance(m, str)]
        if bad:
            msg = f"set_plan takes model ids (strings); got {bad!r}. Map objects to ids first."
            raise TypeError(msg)
        with self._lock:
            planned = [m for m in dict.fromkeys(model_ids) if m in self._hooks]
            for model_id in planned:
                self._remeasure_if_changed(model_id)
            capacity = self._capacity_alone()
            unfit = {m: self._ledger.nbytes(m) for m in planned if self._ledger.nbytes(m) > capacity}
            if unfit:
                intro = "set_plan: the call would use {models}, which cannot fit"
                raise self._unfit(unfit, capacity, intro, " Nothing was moved.")
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

    def check_fit(self, modules: Mapping[str, torch.nn.Module], after: str = "") -> None:
        """Raise ModelTooLargeError, before anything is attached or moved, if a module cannot fit alone.

        Capacity is the device's total (free memory when the total is unknown) minus the margin.

        Args:
            modules: Model ids and the modules that would be attached under them.
            after: A sentence added to the message (what the caller left as it was).
        """
        if self._probe.always_resident:
            return
        total = self._probe.total_bytes()
        with self._lock:
            capacity = self._capacity_alone() if total is None else total - self._margin
        sizes = {model_id: module_nbytes(module) for model_id, module in modules.items()}
        unfit = {model_id: nbytes for model_id, nbytes in sizes.items() if nbytes > capacity}
        if unfit:
            raise self._unfit(unfit, capacity, "{models} cannot fit", after)

    def detach(self, model_id: str) -> None:
        """Remove ``model_id``'s hook; its weights end on the host copy. Waits for its calls in progress in
        other threads to return; calls that start meanwhile wait, then run without offload.

        Raises:
            KeyError: ``model_id`` is not attached.
            RuntimeError: called from inside a call of ``model_id`` in this thread.
            OffloadTimeoutError: its calls did not return within ``wait_timeout`` (nothing changed).
        """
        with self._changed:
            if model_id not in self._hooks:
                msg = f"model id {model_id!r} is not attached; attached: {sorted(self._hooks)}."
                raise KeyError(msg)
            self._calls.await_no_calls([model_id], f"detach({model_id!r})", self._wait_timeout)
            self._detach_now(model_id)
            self._changed.notify_all()

    def _detach_now(self, model_id: str) -> None:
        module = self._ledger.module(model_id)
        was_resident = self._ledger.is_resident(model_id)
        self._ledger.remove(model_id)
        remove_hook(module)
        del self._hooks[model_id]
        self._last_used.pop(model_id, None)
        if was_resident and not self._probe.always_resident:
            self._record(model_id, (model_id,), 0, 0, self._probe.free_bytes(), "detach")

    def close(self) -> None:
        """Detach every model: no hooks, every weight on the host. Waits for the calls in progress in other
        threads to return (new calls wait, then run without offload); a call between two forwards goes on
        without offload.

        Raises:
            RuntimeError: called from inside a hooked call in this thread.
            OffloadTimeoutError: calls did not return within ``wait_timeout`` (nothing changed).
        """
        with self._changed:
            model_ids = list(self._hooks)
            self._calls.await_no_calls(model_ids, "close()", self._wait_timeout)
            for model_id in model_ids:
                if model_id in self._hooks:  # another thread may have detached it while we waited
                    self._detach_now(model_id)
            self._changed.notify_all()

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

    def running_ids(self) -> list[str]:
        """Ids of the models inside a hooked call now, in any thread (never evicted while there)."""
        with self._lock:
            return list(self._calls.running)

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

    def _capacity_alone(self) -> int:
        """Bytes one model can have with every model of this engine evicted (after the margin)."""
        return self._probe.free_bytes() + self._ledger.resident_bytes() - self._margin

    def _device(self) -> str:
        return messages.device_name(self._probe)

    def _unfit(self, sizes: dict[str, int], capacity: int, intro: str, after: str) -> ModelTooLargeError:
        return ModelTooLargeError(messages.unfit(sizes, capacity, self._device(), self._margin, intro, after))

    def ensure_resident(self, model_id: str) -> None:
        """Make ``model_id`` resident, evicting what the strategy picks. What the hook calls.

        A model whose weights were added, swapped or resized since it was measured (a LoRA injected, a
        submodule replaced) is measured again first. When the room is held by models running in other
        threads, waits for them to return.

        Raises:
            KeyError: ``model_id`` is not attached (or was detached while waiting).
            ModelTooLargeError: it cannot fit even with every other model evicted, or only by evicting a
                model this thread is running (nothing moved).
            OffloadDeadlockError: the threads holding the room all wait for room this thread holds.
            OffloadTimeoutError: the room did not come free within ``wait_timeout``.
            StrategyError: the strategy's victims are invalid or free too little (nothing moved).
        """
        with self._lock:
            if model_id not in self._hooks:
                msg = f"model id {model_id!r} is not attached; attached: {sorted(self._hooks)}."
                raise KeyError(msg)
            self._remeasure_if_changed(model_id)
            if not self._ledger.is_resident(model_id):
                self._place(model_id)
            self._plan.observe(model_id)
            self._last_used[model_id] = next(self._clock)

    def _remeasure_if_changed(self, model_id: str) -> None:
        """Measure ``model_id`` again if its weights changed shape; take it off the device first so its
        host copy covers the new weights (weights created on the device are copied back once)."""
        if not self._ledger.changed(model_id):
            return
        resident = self._ledger.is_resident(model_id) and not self._probe.always_resident
        mine = self._calls.in_call()[model_id]
        if resident and (self._calls.running[model_id] > mine or mine > 1):
            return  # running in another call: measured again once it is between calls
        free_before = self._probe.free_bytes()
        old = self._ledger.nbytes(model_id)
        copied = self._ledger.evict(model_id) if resident else 0
        copied += self._ledger.refresh(model_id)
        self._record(model_id, (model_id,) if resident else (), 0, copied, free_before, "remeasure")
        logger.info(
            "%s changed: %s -> %s", model_id, format_bytes(old), format_bytes(self._ledger.nbytes(model_id))
        )
        self._changed.notify_all()

    def _place(self, model_id: str) -> None:
        """Place ``model_id``, waiting while the room it needs is held by models running in other threads."""
        deadline = time.monotonic() + self._wait_timeout
        me = threading.get_ident()
        while True:
            if model_id not in self._hooks:
                msg = f"model id {model_id!r} was detached while it waited for room on {self._probe.name}."
                raise KeyError(msg)
            if self._ledger.is_resident(model_id):
                return  # placed by another thread's call while this one waited
            nbytes = self._ledger.nbytes(model_id)
            free_before, free = self._free_after_margin()
            if nbytes <= free:
                self._move_in(model_id, [], free_before, "fits")
                return
            residents = self._ledger.residents()
            order = sorted(residents, key=lambda m: self._last_used.get(m, 0))
            evictable = {m: residents[m] for m in order if not self._calls.running[m]}
            room = free + sum(evictable.values())
            if nbytes <= room:
                self._evict_for(model_id, nbytes, free, free_before, evictable)
                return
            if nbytes > free + sum(residents.values()):
                capacity = free + sum(residents.values())
                raise ModelTooLargeError(
                    messages.too_large(model_id, nbytes, capacity, self._device(), self._margin)
                )
            held = {m: size for m, size in residents.items() if m not in evictable}
            mine = {m: size for m, size in held.items() if self._calls.in_call(me)[m]}
            if nbytes > room + sum(size for m, size in held.items() if m not in mine):
                reachable = room + sum(size for m, size in held.items() if m not in mine)
                raise ModelTooLargeError(
                    messages.needs_own_running(model_id, nbytes, reachable, mine, self._device())
                )
            if self._calls.wait_for_cycle(held, room):
                raise OffloadDeadlockError(self._cycle_message(model_id, nbytes, held, mine))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                blockers = [
                    (m, self._calls.name(thread), held[m])
                    for thread, models in self._calls.holders(held).items()
                    if thread != me
                    for m in models
                ]
                raise OffloadTimeoutError(
                    messages.wait_timeout(
                        model_id, nbytes, self._wait_timeout, self._device(), blockers, room
                    )
                )
            name = threading.current_thread().name
            self._calls.waiting[me] = Waiter(model_id, nbytes, name)
            try:
                self._changed.wait(remaining)
            finally:
                del self._calls.waiting[me]

    def _cycle_message(self, model_id: str, nbytes: int, held: dict[str, int], mine: dict[str, int]) -> str:
        me = threading.get_ident()
        others = [
            (
                self._calls.name(thread),
                {m: held[m] for m in models},
                self._calls.waiting[thread].model_id,
                self._calls.waiting[thread].nbytes,
            )
            for thread, models in self._calls.holders(held).items()
            if thread != me
        ]
        return messages.wait_for_cycle(model_id, nbytes, self._device(), mine, others)

    def _evict_for(
        self, model_id: str, nbytes: int, free: int, free_before: int, evictable: dict[str, int]
    ) -> None:
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
            freed_text, shortfall = format_bytes_distinct(freed, request.shortfall)
            wanted, free = format_bytes_distinct(request.nbytes, request.free)
            msg = (
                f"strategy {name} returned victims {victims!r} freeing {freed_text}, but "
                f"{request.model_id!r} needs {shortfall} more free ({wanted} wanted, {free} free after the margin)."
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
        with self._changed:
            if self._ledger.is_resident(model_id) and not self._probe.always_resident:
                free_before = self._probe.free_bytes()
                to_host = self._ledger.evict(model_id)
                self._record(model_id, (model_id,), 0, to_host, free_before, "evict")
                self._changed.notify_all()

    def refresh_host_copy(self, model_id: str) -> None:
        """Bring ``model_id``'s host copy and size up to date after its weights changed in place."""
        with self._changed:
            free_before = self._probe.free_bytes()
            to_host = self._ledger.refresh(model_id)
            self._record(model_id, (), 0, to_host, free_before, "refresh")
            self._changed.notify_all()

    # -- one hooked call -----------------------------------------------------------------------
    def run_forward(
        self,
        model_id: str,
        forward: Callable,
        args: tuple,
        kwargs: dict,
        pre_forward: Callable[..., tuple[tuple, dict]] | None = None,
    ):
        """Run one hooked call of ``model_id``: ``pre_forward`` (the hook's: place, move inputs), then
        ``forward``; on out-of-memory evict every other model and run it once more.

        From start to end the model counts as running in this thread: no other thread evicts it, and
        ``detach``/``close`` wait for it. A call that starts while the model is being detached waits, then
        runs ``forward`` without offload.
        """
        with self._lock:
            attached = self._calls.enter(model_id, self.has_hook)
        if not attached:
            return forward(*args, **kwargs)
        try:
            if (
                pre_forward is not None
            ):  # else ``forward`` calls the hook's pre_forward itself (encode/decode)
                args, kwargs = pre_forward(*args, **kwargs)
                with self._lock:
                    if not self._ledger.is_resident(model_id):
                        # Evicted by hand (engine.evict) after the hook placed it.
                        self._place(model_id)
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
                self._calls.exit(model_id)

    def _evict_all_but(self, model_id: str) -> None:
        with self._changed:
            victims = [m for m in self._ledger.residents() if m != model_id and not self._calls.running[m]]
            free_before = self._probe.free_bytes()
            to_host = sum(self._ledger.evict(v) for v in victims)
            if self._probe.execution_device.type == "cuda":
                torch.cuda.empty_cache()
            self._record(model_id, tuple(victims), 0, to_host, free_before, "oom retry")
            self._changed.notify_all()
