"""The offload engine: one device, its ledger, a strategy, the plan, the hooks and the log.

The engine is the front door: settings, the plan, queries, and the calls it hands on. Placing a model, and
waiting for room under threads, is ``offload.engine.placement.Placer``'s job; attaching and detaching models is
``offload.engine.attachments``'; one hooked call is ``offload.engine.hooked_call``'s.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

from offload.devices.clock import SimulatedClock
from offload.devices.probes import MemoryProbe, resolve_probe
from offload.devices.units import format_bytes, parse_bytes
from offload.engine import attachments, hooked_call
from offload.engine.calls import CallTracker, check_wait_timeout
from offload.engine.fit import check_fit, check_plan_fit, set_strategy_if_fit
from offload.engine.hook import OffloadHook
from offload.engine.placement import Placer
from offload.host.host_tier import HostTier
from offload.records.log import OffloadLog
from offload.records.residency import Residency
from offload.strategies.next_use import NextUseStrategy
from offload.strategies.peer_strategy import as_strategy
from offload.strategies.plan import ExecutionPlan
from offload.strategies.strategy import SupportsSelectVictims
from offload.weights.ledger import ResidencyLedger
from offload.weights.pinned import pinned_location

__all__ = ["OffloadEngine"]


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
        host_budget: Bytes (or ``"48GB"``) of host copies to hold; past it, the models needed least soon
            drop theirs and are read back from disk when next placed (``offload.host.host_tier``). ``None``: what
            the host has available, less a margin. Not with ``device="cpu"``.
        spill_folder: Where weights that differ from the files a model was loaded from are written; ``None``
            for a temporary folder. Removed (or emptied of our files) at ``close``.
    """

    # A forward that runs out of memory is run again once, after every other model left the device; False
    # raises at once (the peer's retry_on_oom=False). Set by ComponentsManager.enable_auto_cpu_offload.
    retry_on_oom: bool = True

    def __init__(
        self,
        device: str | torch.device | MemoryProbe | None = None,
        memory_reserve_margin: int | str = "3GB",
        strategy: object | None = None,
        wait_timeout: float = 600.0,
        host_budget: int | str | None = None,
        spill_folder: str | os.PathLike | None = None,
    ):
        self._probe = resolve_probe(device)
        if self._probe.always_resident and (host_budget is not None or spill_folder is not None):
            msg = "host_budget and spill_folder need a device to offload to; device='cpu' keeps every model on the host."
            raise ValueError(msg)
        margin = parse_bytes(memory_reserve_margin, name="memory_reserve_margin")
        self._ledger = ResidencyLedger(self._probe)
        checked: SupportsSelectVictims = NextUseStrategy()
        if (
            strategy is not None
        ):  # one written for diffusers' manager runs behind offload/strategies/peer_strategy.py
            checked = as_strategy(strategy, self._ledger.module, self._probe.execution_device)
        self._hooks: dict[str, OffloadHook] = {}
        timeout = check_wait_timeout(wait_timeout)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified when room may have been freed
        # Models inside a hooked call (never evicted), threads waiting for room, models being detached.
        self._calls = CallTracker(self._changed)
        self.log = OffloadLog(device=self._probe.name)
        # Told ("plan", ids) after set_plan and ("use", id) after ensure_resident, under the lock (UseRecorder).
        self.watchers: list[Callable[[str, object], None]] = []
        # Places models: holds the settings, the plan and the use history; called with self._lock held.
        self._placer = Placer(
            probe=self._probe,
            ledger=self._ledger,
            attached=self._hooks,
            calls=self._calls,
            changed=self._changed,
            log=self.log,
            margin=margin,
            strategy=checked,
            wait_timeout=timeout,
        )
        # Host copies within a budget, disk behind them (with device="cpu", no budget: nothing is dropped).
        budget = sys.maxsize if self._probe.always_resident else host_budget
        calls, request = self._calls.running.__getitem__, self._placer.request
        self._host = HostTier(
            self._probe, self._ledger, self.log, budget, spill_folder, calls, request, lock=self._lock
        )
        self._placer.beyond.on_disk = self._host.on_disk  # prefetch leaves models on disk alone

    def __repr__(self) -> str:
        margin = format_bytes(self._placer.margin)
        return (
            f"OffloadEngine(device={self._probe.name!r}, memory_reserve_margin={margin!r}, "
            f"strategy={self._placer.strategy!r}, models={len(self._hooks)}, resident={self.resident_ids()})"
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
        return self._placer.margin

    @memory_reserve_margin.setter
    def memory_reserve_margin(self, value: int | str) -> None:
        margin = parse_bytes(value, name="memory_reserve_margin")
        with self._changed:
            self._placer.margin = margin
            self._changed.notify_all()

    @property
    def wait_timeout(self) -> float:
        """Seconds a call waits for room held by running models (and ``close`` for calls) before giving up."""
        return self._placer.wait_timeout

    @wait_timeout.setter
    def wait_timeout(self, value: float) -> None:
        self._placer.wait_timeout = check_wait_timeout(value)

    @property
    def prefetch(self) -> bool:
        """Move the plan's next model (and a streamed model's next group) in while the current one computes;
        off by default. Never evicts a model needed sooner (``offload.partial.prefetch``), and never makes a model that
        streams fail: one with no room for two of its groups streams one at a time, said once per model on
        the ``offload.engine.engine`` logger (``offload.partial.beyond``)."""
        return self._placer.beyond.prefetch

    @prefetch.setter
    def prefetch(self, value: bool) -> None:
        with self._lock:
            self._placer.beyond.prefetch = bool(value)

    @property
    def shrink_victims(self) -> bool:
        """Let a victim keep a resident prefix instead of leaving whole when that moves fewer bytes and the
        strategy allows it (``offload.partial.shrink``); on by default."""
        return self._placer.shrink

    @shrink_victims.setter
    def shrink_victims(self, value: bool) -> None:
        with self._lock:
            self._placer.shrink = bool(value)

    @property
    def simulated_clock(self) -> SimulatedClock | None:
        """The simulated clock of a ``SimulatedDevice`` given ``h2d_bandwidth`` (``offload.devices.clock``), else None."""
        return self._placer.beyond.clock

    @property
    def strategy(self) -> SupportsSelectVictims:
        """The strategy that picks victims."""
        return self._placer.strategy

    @property
    def host_tier(self) -> HostTier:
        """The host tier: the host budget, the spill folder, which models are on disk."""
        return self._host

    def set_strategy(self, strategy: object) -> None:
        """Use ``strategy`` from now on (any object with ``select_victims(request)``); a placement in
        progress finishes with the one it started with.

        Raises:
            ValueError: its ``device_limit`` refuses the device. ModelTooLargeError: an attached model could not
                fit (nor stream) under that limit. Either way the strategy in use stays.
        """
        checked = as_strategy(strategy, self._ledger.module, self._probe.execution_device)
        with self._lock:
            set_strategy_if_fit(self._placer, checked)

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
                if not self._host.on_disk(model_id):  # measured once read back
                    self._placer.remeasure_if_changed(model_id)
            check_plan_fit(self._placer, planned)
            self._placer.set_plan(model_ids)
            for watcher in self.watchers:
                watcher("plan", model_ids)

    def expect_calls(self, plans: Sequence[Sequence[str]]) -> None:
        """Say which pipeline calls come after the running one, in order (each as its models' ids; a server
        knows its queue). While set, the strategy learns from these and the running call's plan instead of
        the recent calls' history (``OffloadRequest.recent_plans``), so right after a switch of pipelines it
        keeps the models the queue needs next rather than those the history used most. ``()`` clears it.

        Raises:
            TypeError: an id is not a string.
        """
        expected = tuple(tuple(plan) for plan in plans)
        bad = [m for plan in expected for m in plan if not isinstance(m, str)]
        if bad:
            msg = f"expect_calls takes plans of model ids (strings); got {bad!r}. Map objects to ids first."
            raise TypeError(msg)
        with self._lock:
            self._placer.expected = expected

    # -- attach / detach -----------------------------------------------------------------------
    def attach(
        self, model_id: str, module: torch.nn.Module, weight_files: Sequence[str] = (), pinned: bool = False
    ) -> None:
        """Hook ``module`` under ``model_id`` and keep its weights on the host copy. Idempotent per id.

        ``weight_files`` are the safetensors files it was loaded from: under a host budget, its unchanged
        weights are read back from them rather than written to the spill folder. A ``pinned`` module (or one
        marked with ``offload.pin``) stays where it is, its device bytes used from now on (``offload.weights.pinned``).

        Raises:
            TypeError: ``module`` is not a ``torch.nn.Module``.
            ValueError: the id is attached to another module, the module is attached under another id,
                or it already carries a foreign accelerate hook.
            HostBudgetError: it is larger than the host budget and ``weight_files`` do not hold it all.
            ModelTooLargeError: it is pinned and leaves itself no room on the device, the margin kept.
        """
        attachments.attach(self, model_id, module, weight_files, pinned)

    def check_fit(
        self,
        modules: Mapping[str, torch.nn.Module],
        after: str = "",
        weight_files: Mapping[str, Sequence[str]] | None = None,
        pinned: Collection[str] = (),
    ) -> None:
        """Raise ModelTooLargeError, before anything is attached or moved, if a module cannot fit alone.

        Capacity is the device's total (free memory when the total is unknown) minus the margin and the
        pinned models' bytes (``offload.engine.fit``). Raises HostBudgetError if a module is larger than the host
        budget and its ``weight_files`` do not hold it.

        Args:
            modules: Model ids and the modules that would be attached under them.
            after: A sentence added to the message (what the caller left as it was).
            weight_files: The safetensors files each module was loaded from, by model id.
            pinned: The ids among ``modules`` that would be attached pinned (marked ones count too).
        """
        with self._lock:
            check_fit(self._placer, self._host, modules, after, weight_files or {}, pinned)

    def detach(self, model_id: str, read_back: bool = True) -> None:
        """Remove ``model_id``'s hook; its weights end on the host copy. Waits for its calls in progress in
        other threads to return; calls that start meanwhile wait, then run without offload.

        A model whose host copy is on disk is read back first; with ``read_back=False`` nothing is read and the
        weights it held on disk only become meta tensors (no memory; any use fails loudly rather than
        computing on placeholders): what ``ComponentsManager.remove`` does.

        Raises:
            KeyError: ``model_id`` is not attached.
            RuntimeError: called from inside a call of ``model_id`` in this thread.
            OffloadTimeoutError: its calls did not return within ``wait_timeout`` (nothing changed).
            DiskCopyError: with ``read_back``, a file it reads is gone or was replaced (nothing changed).
        """
        attachments.detach(self, model_id, read_back)

    def close(self) -> None:
        """Detach every model: no hooks, every weight on the host. Waits for the calls in progress in other
        threads to return (new calls wait, then run without offload); a call between two forwards goes on
        without offload.

        Raises:
            RuntimeError: called from inside a hooked call in this thread.
            OffloadTimeoutError: calls did not return within ``wait_timeout`` (nothing changed).
        """
        attachments.close(self)

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
        """Ids of the models placed on the device now (pinned models are in ``pinned_ids``)."""
        return list(self._ledger.residents())

    def pinned_ids(self) -> list[str]:
        """Ids of the pinned models: attached, kept where they are (``offload.weights.pinned``)."""
        return list(self._ledger.pinned())

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

    def residency(self, model_id: str) -> Residency:
        """Facts about ``model_id``: attached or not, on the device now or not, the device's name and where
        its forwards run. An id that is not attached is reported as neither attached nor resident."""
        with self._lock:
            return Residency(
                attached=model_id in self._hooks,
                resident=self._ledger.is_resident(model_id),
                device=self._probe.name,
                execution_device=self._probe.execution_device,
                on_disk=self._host.on_disk(model_id),
                disk_nbytes=self._host.disk_nbytes(model_id),
                resident_share=self._placer.beyond.resident_share(model_id),
                pinned=pinned_location(self._probe, self._ledger.module(model_id))
                if self._ledger.is_pinned(model_id)
                else None,
            )

    # -- placement -----------------------------------------------------------------------------
    @property
    def _plan(self) -> ExecutionPlan:
        # The plan in force lives with the placer; tests/offload/test_engine.py reads it under this name.
        return self._placer.plan

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
            with self._host.placing(model_id):
                self._placer.ensure_resident(model_id)
            for watcher in self.watchers:
                watcher("use", model_id)

    def place_if_room(self, model_id: str) -> bool:
        """Make ``model_id`` resident only if it fits in the free room now (above the margin), evicting
        nothing; returns whether it is resident after. For hints from outside a call (a server bringing the
        next job's models up while a job runs): the check and the placement hold the lock together, so a
        forward in another thread never loses a model to it.

        Raises:
            KeyError: ``model_id`` is not attached.
        """
        with self._lock:
            if model_id not in self._hooks:
                raise KeyError(f"{model_id!r} is not attached to this engine")
            if self._ledger.is_resident(model_id):
                return True
            if self._probe.free_bytes() - self.memory_reserve_margin < self._ledger.nbytes(model_id):
                return False
            self.ensure_resident(model_id)
            return True

    def evict(self, model_id: str) -> None:
        """Take ``model_id`` off the device now (nothing is copied back); a pinned model stays."""
        with self._lock:
            self._placer.evict(model_id)

    def refresh_host_copy(self, model_id: str) -> None:
        """Bring ``model_id``'s host copy and size up to date after its weights changed in place."""
        with self._lock:
            self._host.restore(model_id)
            self._placer.refresh(model_id)
            self._host.changed(model_id)

    def convert(self, model_id: str, apply: Callable[[], object]) -> None:
        """Run ``apply``, which converts ``model_id``'s weights in place (its ``.to(dtype)``), with the model off
        the device and its host copy in memory, so the host copy itself is converted; then measure it again.
        Its next placement uploads the converted weights; nothing is copied back. A pinned model converts
        where it stays."""
        with self._lock:
            self._placer.evict(model_id)
            self._host.restore(model_id)
            apply()
            self._placer.refresh(model_id)
            self._host.changed(model_id)

    @contextmanager
    def host_weights(self, model_id: str, drop_after: bool = True) -> Iterator[None]:
        """Inside, ``model_id``'s weights are real tensors on the host or the device, never placeholders: a model
        whose host copy is on disk is read back first, and no host copy of it is dropped until the block ends.
        For every reader of its weights: a save, a state dict, a fused LoRA. The lock is held only to read back
        and to release, so other models run meanwhile. Nests; an id that is not attached is a no-op.

        At the end, with ``drop_after``, host copies are dropped until the budget holds again; so a change made
        in place inside must be told (``refresh_host_copy``) inside too. Without it they are dropped at the
        next placement, as after ``load_host_copy``: for readers that may run in the middle of a change (a
        model's ``state_dict``, which a LoRA loader calls while it injects layers).

        Raises:
            DiskCopyError: a file it reads is gone or was replaced since its host copy was dropped.
        """
        with self._lock:
            held = self._host.hold(model_id)
        try:
            yield
        finally:
            if held:
                with self._lock:
                    self._host.release(model_id, drop=drop_after)

    def load_host_copy(self, model_id: str) -> None:
        """Read ``model_id``'s weights back into host memory if its host copy was dropped under the host
        budget (before editing them in place; the budget holds again at the next placement)."""
        with self._lock:
            self._host.restore(model_id)

    # -- one hooked call -----------------------------------------------------------------------
    def run_forward(
        self,
        model_id: str,
        forward: Callable,
        args: tuple,
        kwargs: dict,
        pre_forward: Callable[..., tuple[tuple, dict]] | None = None,
    ):
        """Run one hooked call of ``model_id`` (``offload.engine.hooked_call``): ``pre_forward`` (the hook's: place,
        move inputs), then ``forward``; on out-of-memory evict every other model and run it once more.

        From start to end the model counts as running in this thread: no other thread evicts it, and
        ``detach``/``close`` wait for it. A call that starts while the model is being detached waits, then
        runs ``forward`` without offload.
        """
        return hooked_call.run_forward(self, model_id, forward, args, kwargs, pre_forward)
