"""Placement: making one attached model resident on the device, and waiting for room under threads.

The engine owns one ``Placer`` and calls it with its lock held. A model whose weights changed is measured
again first; a model that fits moves in; otherwise the strategy picks victims among the models not running.
When only running models hold the room, the call waits for them to return, and fails at once when waiting
cannot help: the room is held by its own thread, or by threads all waiting for room themselves (a
wait-for cycle). Every move is recorded in the engine's log.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Collection, Sequence

import attrs
import torch

from offload.devices.probes import MemoryProbe
from offload.devices.units import format_bytes, format_bytes_distinct
from offload.engine.calls import CallTracker, Waiter
from offload.errors import ModelTooLargeError, OffloadDeadlockError, OffloadTimeoutError, StrategyError
from offload.partial.beyond import Beyond
from offload.partial.shrink import shrink_victims, shrunk_prefix, tail_or_stream
from offload.records import messages
from offload.records.log import OffloadDecision, OffloadLog
from offload.strategies.plan import ExecutionPlan
from offload.strategies.strategy import OffloadRequest, SupportsSelectVictims, strategy_name
from offload.weights.ledger import ResidencyLedger

__all__ = ["Placer"]

# The engine's logger name, which users filter on; placement is part of the engine.
logger = logging.getLogger("offload.engine.engine")


class Placer:
    """Places attached models on one device: measures, waits for room, asks the strategy, moves, records.

    Every method must be called with the lock of ``changed`` (the engine's lock) held; waiting for room
    releases it. The settings (``margin``, ``strategy``, ``wait_timeout``) and ``plan`` are checked by the
    engine before they are set here, and read afresh at each decision.

    Args:
        probe: The memory probe of the execution device.
        ledger: Sizes, host copies and residency of the attached models.
        attached: The ids of the attached models (the engine's live record; only read here).
        calls: The calls in progress per thread and the threads waiting for room.
        changed: The engine's condition, notified when room may have been freed.
        log: Where every move is recorded.
        margin: Bytes kept free beyond the weights.
        strategy: Picks victims.
        wait_timeout: Seconds a call waits for room held by running models.
    """

    def __init__(
        self,
        probe: MemoryProbe,
        ledger: ResidencyLedger,
        attached: Collection[str],
        calls: CallTracker,
        changed: threading.Condition,
        log: OffloadLog,
        margin: int,
        strategy: SupportsSelectVictims,
        wait_timeout: float,
    ) -> None:
        self._probe = probe
        self._ledger = ledger
        self._attached = attached
        self._calls = calls
        self._changed = changed
        self._log = log
        self.margin = margin
        self.strategy = strategy  # through the setter: a strategy with a device_limit is checked here
        self.wait_timeout = wait_timeout
        self.plan = ExecutionPlan()
        self._recent_plans: deque[tuple[str, ...]] = deque(maxlen=32)
        # The calls a caller says come next (a server's queue); while set they stand for the history.
        self.expected: tuple[tuple[str, ...], ...] = ()
        self._clock = itertools.count(1)
        self._last_used: dict[str, int] = {}
        # Streaming models partly resident, prefetch and the simulated clock (offload.partial.beyond).
        self.beyond = Beyond(self)
        self.shrink = (
            True  # victims of a strategy that allows it may keep a resident prefix (offload.partial.shrink)
        )

    # -- plan and use history ------------------------------------------------------------------
    def set_plan(self, model_ids: tuple[str, ...]) -> None:
        """Follow ``model_ids`` from now on; the same plan set again keeps the loops learned in it."""
        loops = self.plan.loops if model_ids == self.plan.model_ids else set()
        self.beyond.new_call(self.plan.model_ids)
        self.plan = ExecutionPlan(model_ids)
        self.plan.loops = loops
        if model_ids:
            self._recent_plans.append(model_ids)

    def forget(self, model_id: str) -> None:
        """Drop the use history of a model that is detached."""
        self._last_used.pop(model_id, None)
        self.beyond.forget(model_id)

    @property
    def strategy(self) -> SupportsSelectVictims:
        """Picks victims. Setting one with ``device_limit(total)`` asks it first (its ValueError changes nothing)."""
        return self._strategy

    @strategy.setter
    def strategy(self, strategy: SupportsSelectVictims) -> None:
        device_limit = None if self._probe.always_resident else getattr(strategy, "device_limit", None)
        total = self._total()
        # Bytes kept free besides the margin so that use stays within the strategy's limit (offload.strategies.watermark).
        self._held_free = 0 if device_limit is None else total - device_limit(total)
        self._strategy = strategy

    # -- room ----------------------------------------------------------------------------------
    def _total(self) -> int:
        total = self._probe.total_bytes()
        return self._probe.free_bytes() + self._ledger.resident_bytes() if total is None else total

    def free_after_margin(self) -> tuple[int, int]:
        """The device's free bytes, and those bytes less the margin (or what the strategy keeps free, if more)."""
        free = self._probe.free_bytes()
        return free, free - max(self.margin, self._held_free)

    def capacity_alone(self) -> int:
        """Bytes one model can have with every model of this engine evicted (after the margin)."""
        return self._probe.free_bytes() + self._ledger.resident_bytes() - self.margin

    def _device(self) -> str:
        return messages.device_name(self._probe)

    # -- placing -------------------------------------------------------------------------------
    def ensure_resident(self, model_id: str) -> None:
        """Make ``model_id`` resident (measured again first if it changed) and record the use."""
        if model_id not in self._attached:
            msg = f"model id {model_id!r} is not attached; attached: {sorted(self._attached)}."
            raise KeyError(msg)
        self.remeasure_if_changed(model_id)
        if not self._ledger.is_resident(model_id) or shrunk_prefix(self._ledger, model_id) is not None:
            self.place(model_id)
        self.plan.observe(model_id)
        self._last_used[model_id] = next(self._clock)
        self.beyond.used(model_id)

    def remeasure_if_changed(self, model_id: str) -> None:
        """Measure ``model_id`` again if its weights changed shape; take it off the device first so its
        host copy covers the new weights (weights created on the device are copied back once)."""
        if not self._ledger.changed(model_id):
            return
        resident = self._ledger.is_resident(model_id) and not self._probe.always_resident
        resident = resident and not self._ledger.is_pinned(model_id)  # a pinned one is measured where it is
        mine = self._calls.in_call()[model_id]
        if resident and (self._calls.running[model_id] > mine or mine > 1):
            return  # running in another call: measured again once it is between calls
        free_before = self._probe.free_bytes()
        old = self._ledger.nbytes(model_id)
        copied = self._ledger.evict(model_id) if resident else 0
        copied += self._ledger.refresh(model_id)
        self.record(model_id, (model_id,) if resident else (), 0, copied, free_before, "remeasure")
        logger.info(
            "%s changed: %s -> %s", model_id, format_bytes(old), format_bytes(self._ledger.nbytes(model_id))
        )
        self._changed.notify_all()

    def place(self, model_id: str) -> None:
        """Place ``model_id``, waiting while the room it needs is held by models running in other threads."""
        deadline = time.monotonic() + self.wait_timeout
        me = threading.get_ident()
        while True:
            if model_id not in self._attached:
                msg = f"model id {model_id!r} was detached while it waited for room on {self._probe.name}."
                raise KeyError(msg)
            prefix = shrunk_prefix(
                self._ledger, model_id
            )  # shrunk (offload.partial.shrink): only its tail moves in
            if self._ledger.is_resident(model_id) and prefix is None:
                return  # placed by another thread's call while this one waited
            nbytes = self._ledger.nbytes(model_id) - (prefix or 0)
            free_before, free = self.free_after_margin()
            if nbytes <= free:
                self._move_in(model_id, [], free_before, "fits")
                return
            residents = self._ledger.residents()
            evictable = self._evictable(residents, model_id)
            room = free + sum(evictable.values())
            if prefix is not None and nbytes <= room:
                if not tail_or_stream(self, model_id, nbytes, free, evictable):
                    self._evict_for(model_id, nbytes, free, free_before, evictable)
                    return
                self.record(model_id, (model_id,), 0, self._ledger.evict(model_id), free_before, "evict")
                continue  # streaming it moves fewer bytes than evicting others for its tail (offload.partial.shrink)
            if prefix is not None and nbytes > free + sum(residents.values()) - prefix:
                self.record(model_id, (model_id,), 0, self._ledger.evict(model_id), free_before, "evict")
                continue  # its tail can never come back beside the others: placed as any model (or streamed)
            streamed = (
                None
                if prefix is not None
                else self.beyond.try_stream(model_id, nbytes, free, free_before, residents, evictable)
            )
            if streamed == 0:
                return
            if streamed is not None:
                nbytes = streamed  # partly resident once running models free this much: wait for them
            elif nbytes <= room:
                self._evict_for(model_id, nbytes, free, free_before, evictable)
                return
            if nbytes > free + sum(residents.values()):
                capacity = free + sum(residents.values())
                raise ModelTooLargeError(
                    messages.too_large(model_id, nbytes, capacity, self._device(), self.margin)
                )
            held = {m: size for m, size in residents.items() if m not in evictable and m != model_id}
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
                    messages.wait_timeout(model_id, nbytes, self.wait_timeout, self._device(), blockers, room)
                )
            name = threading.current_thread().name
            self._calls.waiting[me] = Waiter(model_id, nbytes, name)
            try:
                self._changed.wait(remaining)
            finally:
                del self._calls.waiting[me]

    def room_beside_pinned(self, model_id: str) -> tuple[list[str], int]:
        """Evict what the strategy picks among the placed models not running until the margin holds beside
        ``model_id``, a pinned model just added (``offload.weights.pinned``). Returns the victims and the bytes copied
        back. Left over-committed when running models hold the room: the next placement waits for them."""
        _, free = self.free_after_margin()
        evictable = self._evictable(self._ledger.residents(), model_id)  # a pinned model is no resident
        if free >= 0 or sum(evictable.values()) < -free:
            return [], 0
        held = self._ledger.pinned()[model_id]
        request = self.request(model_id, held, free + held, evictable)  # as if it asked to come in
        victims = list(self.strategy.select_victims(request))
        self._check_victims(request, victims)
        return victims, sum(self._ledger.evict(v) for v in victims)

    def _evictable(self, residents: dict[str, int], model_id: str) -> dict[str, int]:
        """The residents that may leave for ``model_id``: not running, not itself; least recently used first."""
        order = sorted(residents, key=lambda m: self._last_used.get(m, 0))
        return {m: residents[m] for m in order if not self._calls.running[m] and m != model_id}

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

    def request(self, model_id: str, nbytes: int, free: int, candidates: dict[str, int]) -> OffloadRequest:
        """What a strategy sees when ``model_id`` needs ``nbytes`` with ``free`` free: the candidates, the plan
        and the use history (the host tier asks the same question of host copies)."""
        return OffloadRequest(
            model_id=model_id,
            nbytes=nbytes,
            free=free,
            residents=candidates,
            upcoming=self.plan.upcoming(model_id) if self.plan else (),
            recent_plans=self._plans_seen(),
            last_used={m: self._last_used.get(m, 0) for m in candidates},
        )

    def _plans_seen(self) -> tuple[tuple[str, ...], ...]:
        """The plans a strategy learns from: the recent calls', or, while a caller said which calls come next,
        those and the running call's (the queue knows better than the history after a switch of pipelines)."""
        if self.expected:
            return (*self.expected, *list(self._recent_plans)[-1:])
        return tuple(self._recent_plans)

    def _evict_for(
        self, model_id: str, nbytes: int, free: int, free_before: int, evictable: dict[str, int]
    ) -> None:
        request = self.request(model_id, nbytes, free, evictable)
        total = self._total()
        request = attrs.evolve(request, device_total=total, device_used=total - self._probe.free_bytes())
        victims = list(self.strategy.select_victims(request))
        self._check_victims(request, victims)
        if self.shrink and getattr(self.strategy, "shrink_victims", False):  # offload.partial.shrink
            surplus = free + sum(request.residents[v] for v in victims) - nbytes
            victims = shrink_victims(self, model_id, victims, surplus)
        reason = f"evict: {strategy_name(self.strategy)}"
        self._move_in(model_id, victims, free_before, reason)

    def _check_victims(self, request: OffloadRequest, victims: list[str]) -> None:
        name = strategy_name(self.strategy)
        unknown = [v for v in victims if v not in request.residents]
        if unknown or len(set(victims)) != len(victims):
            pinned = [v for v in unknown if self._ledger.is_pinned(v)]
            why = f" {pinned!r} pinned: never moved, never a victim." if pinned else ""
            msg = (
                f"strategy {name} returned victims {victims!r} for {request.model_id!r}; each must be one "
                f"of the evictable residents {list(request.residents)} and appear once (bad: {unknown!r}).{why}"
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

    # -- moves ---------------------------------------------------------------------------------
    def _move_in(self, model_id: str, victims: Sequence[str], free_before: int, reason: str) -> None:
        to_host = sum(self._ledger.evict(v) for v in victims)
        to_device = self._ledger.make_resident(model_id)
        self.record(model_id, tuple(victims), to_device, to_host, free_before, reason)
        if victims:
            logger.info("%s: evicted %s to make room for %s", reason, ", ".join(victims), model_id)

    def evict(self, model_id: str) -> None:
        """Take ``model_id`` off the device now (nothing is copied back); a pinned model stays."""
        if self._ledger.is_resident(model_id) and not self._probe.always_resident:
            if self._ledger.is_pinned(model_id):
                return
            free_before = self._probe.free_bytes()
            to_host = self._ledger.evict(model_id)
            self.record(model_id, (model_id,), 0, to_host, free_before, "evict")
            self._changed.notify_all()

    def refresh(self, model_id: str) -> None:
        """Bring ``model_id``'s host copy and size up to date after its weights changed in place."""
        free_before = self._probe.free_bytes()
        to_host = self._ledger.refresh(model_id)
        self.record(model_id, (), 0, to_host, free_before, "refresh")
        self._changed.notify_all()

    def evict_all_but(self, model_id: str) -> None:
        """Evict every model but ``model_id`` that is not running: the out-of-memory retry."""
        victims = [m for m in self._ledger.residents() if m != model_id and not self._calls.running[m]]
        free_before = self._probe.free_bytes()
        to_host = sum(self._ledger.evict(v) for v in victims)
        if self._probe.execution_device.type == "cuda":
            torch.cuda.empty_cache()
        self.record(model_id, tuple(victims), 0, to_host, free_before, "oom retry")
        self._changed.notify_all()

    def record(
        self,
        model_id: str,
        victims: Sequence[str],
        to_device: int,
        to_host: int,
        free_before: int,
        reason: str,
        span: tuple[float, float] | None = None,
        sizes: tuple[int, ...] | None = None,
    ) -> None:
        """Append one decision to the log, with the free bytes after it (and, on a simulated clock, when its
        copy ran: ``span``, or timed here) and the sizes of the models it names (``sizes``, or read from the
        ledger here: 0 for one it no longer holds)."""
        if sizes is None:
            ledger = self._ledger
            sizes = tuple(ledger.nbytes(m) if m in ledger else 0 for m in (model_id, *victims))
        clock = self.beyond.clock
        if span is None and clock is not None and to_device:
            span = clock.copy(model_id, to_device, early=reason == "prefetch")
        if to_device:
            self._probe.on_moved(to_device)
        decision = OffloadDecision(
            time=time.time(),
            model_id=model_id,
            evicted=tuple(victims),
            bytes_to_device=to_device,
            bytes_to_host=to_host,
            free_before=free_before,
            free_after=self._probe.free_bytes(),
            reason=reason,
            start=None if span is None else span[0],
            end=None if span is None else span[1],
            sizes=sizes,
        )
        self._log.append(decision)
