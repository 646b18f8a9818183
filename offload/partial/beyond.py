"""Beyond whole models: streaming a model partly resident, prefetching the next one, and the simulated clock.

The placer asks ``Beyond`` first whenever a model does not fit in what is free. Streaming is chosen when
the model cannot fit even with every other model evicted, or when evicting would move more bytes than
streaming over the uses to come: evicting costs each victim the plan needs again its size times its
remaining uses (it comes back each time), and, when a victim comes back before this model's next use,
this model's size at each of its own later uses (the victim evicts it in turn); streaming costs the
model's streamed bytes times its remaining uses. Remaining uses come from the plan's window (the rest of this loop iteration and one
more) and, once a plan ran before, from how often each model was used in its last run (a denoiser used
28 times streams its tail 28 times).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from offload.devices.clock import SimulatedClock
from offload.devices.storage import module_nbytes
from offload.devices.units import format_bytes, format_bytes_distinct
from offload.errors import ModelTooLargeError
from offload.partial.groups import BASE, WeightGroup, split_groups
from offload.partial.prefetch import CopyStream, next_model, prefetch_victims
from offload.partial.streaming import GroupStreamer, Layout, best_layout, smallest_layout

if TYPE_CHECKING:
    from offload.engine.placement import Placer

__all__ = ["Beyond", "streamed_fit_error"]

# The engine's logger name, which users filter on; streaming is part of placement.
logger = logging.getLogger("offload.engine.engine")


def streamed_fit_error(
    model_id: str, groups: Sequence[WeightGroup], capacity: int, device: str, margin: int
) -> str | None:
    """Why a model split into ``groups`` (``split_groups``, which its caller has already) cannot fit
    ``capacity`` bytes even streamed one group at a time, or None if it can (prefetch, which wants room for
    two, is skipped where there is none: ``Beyond.slots_for``)."""
    smallest = smallest_layout(groups, 1)
    if smallest.footprint <= capacity:
        return None
    base, largest = groups[0], max(groups[1:], key=lambda g: g.nbytes)
    need, most, base_size, largest_size = format_bytes_distinct(
        smallest.footprint, max(capacity, 0), base.nbytes, largest.nbytes
    )
    if largest.nbytes >= base.nbytes:
        what = (
            f"its group {largest.name!r} ({largest_size}) must be on the device together with its base group "
            f"{BASE!r} ({base_size})"
        )
    else:
        what = (
            f"its base group {BASE!r} ({base_size}: what no block holds) must stay on the device beside its "
            f"largest streamed group {largest.name!r} ({largest_size})"
        )
    return (
        f"model {model_id!r} cannot fit on {device} even streamed group by group: {what}, {need} in all, but "
        f"at most {most} can be made free with every other model evicted (memory_reserve_margin "
        f"{format_bytes(margin)}). {_FIX}"
    )


_FIX = (
    "Use a larger device, a smaller memory_reserve_margin, or load the model in a smaller dtype or quantized."
)


class Beyond:
    """Partial residency, prefetch and the simulated clock of one engine's placer (called under its lock).

    A part of the placer kept in its own module: it reads the placer's ledger, probe and calls directly.

    Args:
        placer: The placer it serves.
    """

    def __init__(self, placer: Placer):
        self._placer = placer
        probe = placer._probe
        self.prefetch = False
        bandwidth = getattr(probe, "h2d_bandwidth", None)
        self.clock = SimulatedClock(bandwidth, getattr(probe, "compute_time", {})) if bandwidth else None
        device = probe.execution_device
        self._copies = CopyStream(device) if probe.moves_weights and device.type == "cuda" else None
        self._streamers: dict[str, GroupStreamer] = {}
        self._events: dict[str, object] = {}  # CUDA events of whole-model prefetches not yet waited on
        self._uses: Counter[str] = Counter()
        # Whether a model's host copy is dropped to disk (the host tier reads it back when it is placed, so a
        # prefetch, which bypasses that, leaves it alone). Set by the engine when it has a host tier.
        self.on_disk: Callable[[str], bool] = lambda model_id: False
        self._last_uses: dict[tuple[str, ...], Counter[str]] = {}
        self._told_no_prefetch: set[str] = set()  # models whose skipped prefetch was logged (once each)

    def slots_for(self, model_id: str, groups: Sequence[WeightGroup], capacity: int) -> int:
        """Streamed groups ``model_id`` (split in ``groups``) holds room for: two with prefetch (the one running
        and the next), else one. With prefetch, one too when its smallest layout with two does not fit
        ``capacity`` (the room with every other model evicted): an optimisation never makes a model that
        streams fail; said once per model (``offload.engine.engine`` logger)."""
        if not self.prefetch:
            return 1
        if smallest_layout(groups, 2).footprint <= capacity:
            return 2
        self.skip_prefetch(model_id, "the device has no room for two of its groups at once")
        return 1

    def skip_prefetch(self, model_id: str, why: str) -> None:
        """Say, the first time only, that ``model_id`` streams its groups without prefetch, and ``why``."""
        if model_id in self._told_no_prefetch:
            return
        self._told_no_prefetch.add(model_id)
        logger.warning(
            "prefetch skipped for %s on %s: %s; its groups stream one at a time (said once per model).",
            model_id,
            self._placer._device(),
            why,
        )

    # -- uses ----------------------------------------------------------------------------------
    def new_call(self, previous: tuple[str, ...]) -> None:
        """A new pipeline call starts; remember how often ``previous``'s run used each model."""
        if previous and self._uses:
            self._last_uses[previous] = self._uses
        self._uses = Counter()

    def remaining_uses(self, model_id: str, upcoming: Sequence[str], now: int = 0) -> int:
        """Uses of ``model_id`` still to come in this call (``now``: 1 when one is starting)."""
        last = self._last_uses.get(self._placer.plan.model_ids, Counter())
        return max(list(upcoming).count(model_id) + now, last[model_id] - self._uses[model_id])

    # -- streaming -----------------------------------------------------------------------------
    def unstreamable(
        self, modules: Mapping[str, torch.nn.Module], capacity: int
    ) -> tuple[dict[str, int], list[str]]:
        """Of models too large to fit ``capacity`` whole: the sizes of those that cannot be split at all,
        and why each of the others cannot fit even streamed (those that can are left out)."""
        placer = self._placer
        whole: dict[str, int] = {}
        problems = []
        for model_id, module in modules.items():
            groups = split_groups(module)
            if len(groups) == 1:
                whole[model_id] = module_nbytes(module)
                continue
            device, margin = placer._device(), placer.margin
            problem = streamed_fit_error(model_id, groups, capacity, device, margin)
            if problem is not None:
                problems.append(problem)
        return whole, problems

    def streamer(self, model_id: str) -> GroupStreamer:
        """The streamer of ``model_id``, split again if its weights were measured anew since."""
        ledger = self._placer._ledger
        streamer = self._streamers.get(model_id)
        if streamer is None or streamer.measured != ledger.nbytes(model_id):
            if streamer is not None:
                streamer.remove()
            streamer = GroupStreamer(model_id, ledger, self._copies, self.clock)
            self._streamers[model_id] = streamer
        return streamer

    def try_stream(
        self,
        model_id: str,
        nbytes: int,
        free: int,
        free_before: int,
        residents: Mapping[str, int],
        evictable: Mapping[str, int],
    ) -> int | None:
        """Place ``model_id`` partly if that is chosen: 0 when placed, None to place it whole, or the bytes
        the smallest streamed layout needs when only running models hold them (the caller waits)."""
        placer = self._placer
        if placer._probe.always_resident:
            return None
        capacity = free + sum(residents.values())
        forced = nbytes > capacity
        if not forced and nbytes > free + sum(evictable.values()):
            return None  # fits once running models return: waiting for them beats streaming
        upcoming = placer.plan.upcoming(model_id) if placer.plan else ()
        spare = {m: size for m, size in evictable.items() if m not in upcoming}
        streamer = self.streamer(model_id)
        if len(streamer.groups) == 1:
            return None  # nothing to stream: placed whole, or too large as a whole
        if forced:
            problem = streamed_fit_error(model_id, streamer.groups, capacity, placer._device(), placer.margin)
            if problem is not None:
                raise ModelTooLargeError(problem)
        slots = self.slots_for(model_id, streamer.groups, capacity)
        pool: Mapping[str, int] = spare
        layout = best_layout(streamer.groups, free + sum(spare.values()), slots)
        if layout is None or layout.whole:
            if not forced:
                return None
            room, pool = free + sum(evictable.values()), evictable
            layout = best_layout(streamer.groups, room, slots)
            if layout is None and slots > 1:
                layout = best_layout(streamer.groups, room, 1)  # room for one group beside the running models
                if layout is not None:
                    self.skip_prefetch(model_id, "running models hold the room for its next group")
            if layout is None:
                return smallest_layout(streamer.groups, 1).footprint
        if not forced and not self._streaming_is_cheaper(model_id, nbytes, free, evictable, upcoming, layout):
            return None
        request = placer.request(model_id, layout.footprint, free, dict(pool))
        victims = list(placer.strategy.select_victims(request)) if layout.footprint > free else []
        placer._check_victims(request, victims)
        to_host = sum(placer._ledger.evict(v) for v in victims)
        streamer.layout = layout
        owners = [owner for group in layout.groups[: layout.resident] for owner in group.owners]
        to_device = placer._ledger.make_resident(model_id, (owners, layout.prefix, layout.footprint))
        streamer.tell_probe()  # the room for its streamed groups is held from now on, not only when in use
        placer.record(model_id, victims, to_device, to_host, free_before, "stream")
        return 0

    def _streaming_is_cheaper(
        self,
        model_id: str,
        nbytes: int,
        free: int,
        evictable: Mapping[str, int],
        upcoming: Sequence[str],
        layout: Layout,
    ) -> bool:
        placer = self._placer
        request = placer.request(model_id, nbytes, free, dict(evictable))
        victims = list(placer.strategy.select_victims(request))
        uses = self.remaining_uses(model_id, upcoming, now=1)
        evicting = sum(
            evictable.get(v, 0) * self.remaining_uses(v, upcoming) for v in victims if v in upcoming
        )
        upcoming = list(upcoming)
        own_next = upcoming.index(model_id) if model_id in upcoming else len(upcoming)
        if any(v in upcoming[:own_next] for v in victims):
            # A victim back before this model's next use evicts it in turn (they did not fit together).
            evicting += nbytes * (uses - 1)
        streaming = layout.streamed_bytes * uses
        return streaming < evicting

    def end_call(self, model_id: str, thread_done: bool = False) -> None:
        """A call of ``model_id`` returned (or raised): drop its leftover streamed groups and log what it
        streamed. ``thread_done``: it was this thread's outermost call of the model (see ``GroupStreamer.end_call``)."""
        streamer = self._streamers.get(model_id)
        if streamer is None:
            return
        streamer.end_call(thread_done)
        nbytes, to_host, span = streamer.take_call_bytes()
        if nbytes:
            free = self._placer._probe.free_bytes()
            self._placer.record(model_id, (), nbytes, to_host, free, "stream tail", span)

    def forget(self, model_id: str) -> None:
        """``model_id`` was detached: remove its hooks."""
        streamer = self._streamers.pop(model_id, None)
        if streamer is not None:
            streamer.remove()
        self._events.pop(model_id, None)
        self._told_no_prefetch.discard(model_id)

    def resident_share(self, model_id: str) -> float | None:
        """The share of ``model_id``'s bytes resident while it is partly resident, else None."""
        part = self._placer._ledger.partial(model_id)
        return None if part is None else part[0] / max(self._placer._ledger.nbytes(model_id), 1)

    # -- a use: clock and prefetch -------------------------------------------------------------
    def used(self, model_id: str) -> None:
        """``model_id`` is about to run (placed): count the use, tick the clock, wait for its prefetch, and
        prefetch the model the plan needs next."""
        placer = self._placer
        self._uses[model_id] += 1
        event = self._events.pop(model_id, None)
        if event is not None and self._copies is not None:
            module = placer._ledger.module(model_id)
            self._copies.wait(event, [*module.parameters(), *module.buffers()])
        if self.clock is not None:
            part = placer._ledger.partial(model_id)
            share = 1.0 if part is None else part[0] / max(placer._ledger.nbytes(model_id), 1)
            self.clock.compute(model_id, self.clock.seconds_for(model_id, share))
        if self.prefetch and placer.plan:
            self._prefetch_after(model_id)

    def _prefetch_after(self, model_id: str) -> None:
        placer = self._placer
        upcoming = placer.plan.upcoming(model_id)
        target = next_model(model_id, upcoming)
        if target is None or target not in placer._attached or placer._ledger.is_resident(target):
            return
        if self.on_disk(target):
            return
        nbytes = placer._ledger.nbytes(target)
        free_before, free = placer.free_after_margin()
        residents = placer._ledger.residents()
        evictable = {m: s for m, s in residents.items() if m != model_id and not placer._calls.running[m]}
        victims = prefetch_victims(target, nbytes - free, evictable, upcoming) if nbytes > free else []
        if victims is None:
            return  # room only by evicting a model needed sooner: the target is placed when it runs
        to_host = sum(placer._ledger.evict(v) for v in victims)
        if self._copies is not None:
            to_device, self._events[target] = self._copies.run(lambda: placer._ledger.make_resident(target))
        else:
            to_device = placer._ledger.make_resident(target)
        placer.record(target, victims, to_device, to_host, free_before, "prefetch")
