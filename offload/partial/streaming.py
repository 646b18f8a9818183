"""Streaming a model that does not fit: a resident prefix of its groups, the rest moved in per forward.

A model is split into groups (``offload.partial.groups``). Its *layout* keeps the base group and as many blocks
as fit resident (the prefix) and reserves room for ``slots`` streamed groups (two with prefetch where they
fit: the one running and the next; else one). A streamed group is uploaded just before its forward and dropped right after:
the host copy is kept, so nothing is copied back. On a bookkeeping device (``SimulatedDevice``) only
bytes (and simulated time) are counted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence

import attrs
import torch
from torch.utils.hooks import RemovableHandle

from offload.devices.clock import SimulatedClock
from offload.partial.groups import WeightGroup, split_groups
from offload.partial.prefetch import CopyStream
from offload.weights.ledger import ResidencyLedger

__all__ = ["GroupStreamer", "Layout", "best_layout", "smallest_layout"]


@attrs.frozen
class Layout:
    """Which groups of a model stay resident and how much device room it holds.

    Attributes:
        groups: The model's groups, base first.
        resident: How many groups, from the first, stay resident (the base at least).
        prefix: Bytes of the resident groups.
        footprint: Bytes held on the device: the prefix plus room for ``slots`` streamed groups.
        slots: How many streamed groups may be on the device at once.
    """

    groups: tuple[WeightGroup, ...]
    resident: int
    prefix: int
    footprint: int
    slots: int

    @property
    def streamed_bytes(self) -> int:
        """Bytes moved in per call of the model: its size less the prefix."""
        return sum(group.nbytes for group in self.groups[self.resident :])

    @property
    def whole(self) -> bool:
        """True when every group is resident: no streaming needed."""
        return self.resident == len(self.groups)


def _layout(groups: Sequence[WeightGroup], resident: int, slots: int) -> Layout:
    prefix = sum(group.nbytes for group in groups[:resident])
    tail = sorted((group.nbytes for group in groups[resident:]), reverse=True)
    return Layout(tuple(groups), resident, prefix, prefix + sum(tail[:slots]), slots)


def smallest_layout(groups: Sequence[WeightGroup], slots: int) -> Layout:
    """The layout that holds the least: only the base group resident."""
    return _layout(groups, 1, slots)


def best_layout(groups: Sequence[WeightGroup], room: int, slots: int) -> Layout | None:
    """The layout with the longest prefix whose footprint fits ``room``; None if even the smallest does not."""
    for resident in range(len(groups), 0, -1):
        layout = _layout(groups, resident, slots)
        if layout.footprint <= room:
            return layout
    return None


def _device_tensors(owners: Sequence[torch.nn.Module]) -> list[torch.Tensor]:
    return [t for o in owners for t in (*o._parameters.values(), *o._buffers.values()) if t is not None]


class GroupStreamer:
    """The streamed groups of one model: forward hooks that move each in before its forward and out after.

    The hooks stay installed while the model is attached and act only while ``layout`` streams (the
    engine sets it when it places the model partly, and clears it when the model leaves the device). The
    ledger moves the groups' tensors (``ResidencyLedger.upload_group``/``drop_group``), as it moves whole
    models: one path, the host copies kept.

    The model's footprint holds room for ``layout.slots`` streamed groups, whoever calls it. Two threads
    calling the model at once share that room: a group comes in only when it fits beside the groups other
    forwards are running, else its forward waits for one of them to end. Waiting per group (not a lock over
    the whole call) lets the callers overlap on the resident groups and never holds a lock across a call
    that may raise or be entered without the engine (a block called directly).

    Args:
        model_id: The model's id.
        ledger: The ledger the model is attached in (its module, its residency, and the moves).
        copies: The side stream prefetches use (CUDA), or None.
        clock: The simulated clock, or None.
    """

    def __init__(
        self,
        model_id: str,
        ledger: ResidencyLedger,
        copies: CopyStream | None,
        clock: SimulatedClock | None,
    ):
        self.model_id = model_id
        self._ledger = ledger
        self.groups = tuple(split_groups(ledger.module(model_id)))
        self.nbytes = sum(group.nbytes for group in self.groups)
        self.measured = ledger.nbytes(model_id)  # the ledger's size of the model when it was split
        self.layout: Layout | None = None
        self._copies = copies
        self._clock = clock
        self._room = threading.Condition()  # notified when a streamed group leaves the device
        self._users: dict[int, int] = {}  # loaded group index -> forwards running it (0: prefetched)
        self._mine: dict[int, Counter[int]] = {}  # thread -> the groups whose forward it is in
        self._over = False  # loaded groups outgrew the room reserved for them (told to the probe)
        self._events: dict[int, object] = {}  # CUDA events of prefetches not yet waited on
        self.call_bytes = 0  # streamed during the calls since the last ``take_call_bytes``
        self.call_to_host = 0  # copied back (weights replaced on the device mid-forward) since then
        self.call_times: list[tuple[float, float]] = []
        self._handles: list[RemovableHandle] = []
        for index, group in enumerate(self.groups):
            if group.entry is not None:
                self._handles.append(group.entry.register_forward_pre_hook(self._pre_hook(index)))
                self._handles.append(
                    group.entry.register_forward_hook(self._post_hook(index), always_call=True)
                )

    def remove(self) -> None:
        """Remove the hooks (the model is detached); every group must be dropped already."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- hooks ---------------------------------------------------------------------------------
    def _pre_hook(self, index: int) -> Callable[..., None]:
        def pre_hook(module: torch.nn.Module, args: object) -> None:
            self.enter(index)

        return pre_hook

    def _post_hook(self, index: int) -> Callable[..., None]:
        def post_hook(module: torch.nn.Module, args: object, output: object) -> None:
            self.exit(index)

        return post_hook

    def _streamed(self, index: int) -> bool:
        return (
            self.layout is not None
            and index >= self.layout.resident
            and self._ledger.partial(self.model_id) is not None
        )

    def _fits(self, index: int) -> bool:
        """True if group ``index`` fits beside the loaded groups in the room reserved for streamed groups."""
        assert self.layout is not None  # only asked while streaming
        loaded = sum(self.groups[i].nbytes for i in self._users)
        return loaded + self.groups[index].nbytes <= self.layout.footprint - self.layout.prefix

    def enter(self, index: int) -> None:
        """Before group ``index``'s forward: have it on the device (waiting for its prefetch if late, or for
        room while other threads' forwards hold it)."""
        me = threading.get_ident()
        with self._room:
            while True:
                if not self._streamed(index):
                    return
                if index in self._users:
                    self._wait(index)
                    break
                self._drop_unused()
                # A thread already inside a group of this model (a block calling another) cannot wait for
                # itself: its group comes in beyond the reserved room, as it would without threads.
                if self._fits(index) or self._mine.get(me):
                    self._load(index, early=False)
                    break
                self._room.wait()
            assert self.layout is not None  # _streamed checked it
            self._users[index] += 1
            self._mine.setdefault(me, Counter())[index] += 1
            if self._clock is not None:
                share = self.groups[index].nbytes / max(self.nbytes, 1)
                self._clock.compute((self.model_id, index), self._clock.seconds_for(self.model_id, share))
            following = index + 1
            if (
                self.layout.slots > 1
                and following < len(self.groups)
                and following not in self._users
                and self._fits(following)
            ):
                self._load(following, early=True)

    def exit(self, index: int) -> None:
        """After group ``index``'s forward (also when it raised): drop it unless another forward runs it."""
        me = threading.get_ident()
        with self._room:
            mine = self._mine.get(me)
            if not mine or not mine[index]:
                return  # its enter streamed nothing
            mine[index] -= 1
            if not mine[index]:
                del mine[index]
            if not mine:
                del self._mine[me]
            self._users[index] -= 1
            if self._users[index] <= 0:
                self._unload(index)

    def end_call(self, thread_done: bool = False) -> None:
        """The model's call returned: drop what is still here (a prefetch its call did not use).

        ``thread_done``: the current thread's outermost call of the model ended, so none of its group forwards
        can still run: a group it still counts as inside (its forward left by a ``KeyboardInterrupt``, for which
        torch runs no ``always_call`` hook, so ``exit`` never ran) is left, and dropped unless another thread's
        forward runs it."""
        with self._room:
            if thread_done:
                for index, count in self._mine.pop(threading.get_ident(), Counter()).items():
                    self._users[index] -= count
            self._drop_unused()

    def take_call_bytes(self) -> tuple[int, int, tuple[float, float] | None]:
        """Bytes streamed and bytes copied back since the last take, and the span of the copies on the
        simulated clock."""
        with self._room:
            nbytes, to_host, times = self.call_bytes, self.call_to_host, self.call_times
            self.call_bytes, self.call_to_host, self.call_times = 0, 0, []
        span = (times[0][0], times[-1][1]) if times else None
        return nbytes, to_host, span

    # -- moves ---------------------------------------------------------------------------------
    def _load(self, index: int, early: bool) -> None:
        group = self.groups[index]
        if early and self._copies is not None:
            _, self._events[index] = self._copies.run(
                lambda: self._ledger.upload_group(self.model_id, group.owners)
            )
        else:
            # Pinned host copies: the copy is queued on the compute stream, in order with the forward.
            self._ledger.upload_group(self.model_id, group.owners)
        self._users[index] = 0
        self.call_bytes += group.nbytes
        if self._clock is not None:
            self.call_times.append(self._clock.copy((self.model_id, index), group.nbytes, early=early))
        self.tell_probe()

    def _wait(self, index: int) -> None:
        event = self._events.pop(index, None)
        if event is not None and self._copies is not None:
            self._copies.wait(event, _device_tensors(self.groups[index].owners))

    def _unload(self, index: int) -> None:
        self._events.pop(index, None)
        self.call_to_host += self._ledger.drop_group(self.model_id, self.groups[index].owners)
        del self._users[index]
        self.tell_probe()
        self._room.notify_all()

    def _drop_unused(self) -> None:
        for index in [i for i, users in self._users.items() if users <= 0]:
            self._unload(index)

    def tell_probe(self) -> None:
        """Keep the probe's count true: the model holds its footprint, or more while its loaded groups
        outgrow the room reserved for them (a nested group forward); a real device is told the part of that
        room no group occupies now, which its driver would otherwise report free (``MemoryProbe.hold_room``)."""
        layout = self.layout
        if layout is None or self._ledger.partial(self.model_id) is None:  # off the device (evicted by hand)
            self._over = False
            return
        held = layout.prefix + sum(self.groups[i].nbytes for i in self._users)
        if held > layout.footprint or self._over:
            self._over = held > layout.footprint
            self._ledger.probe.on_resident(self.model_id, max(held, layout.footprint))
        self._ledger.probe.hold_room(self.model_id, max(0, layout.footprint - held))
