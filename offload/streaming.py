"""Streaming a model that does not fit: a resident prefix of its groups, the rest moved in per forward.

A model is split into groups (``offload.groups``). Its *layout* keeps the base group and as many blocks
as fit resident (the prefix) and reserves room for ``slots`` streamed groups (two with prefetch: the one
running and the next). A streamed group is uploaded just before its forward and dropped right after:
the host copy is kept, so nothing is copied back. On a bookkeeping device (``SimulatedDevice``) only
bytes (and simulated time) are counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import attrs
import torch
from torch.utils.hooks import RemovableHandle

from offload.clock import SimulatedClock
from offload.groups import WeightGroup, split_groups
from offload.prefetch import CopyStream

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


def _load(
    owners: Sequence[torch.nn.Module], device: torch.device, non_blocking: bool
) -> dict[tuple, torch.Tensor]:
    """Point ``owners``' own tensors at device copies; returns the host tensors to point back at."""
    host: dict[tuple, torch.Tensor] = {}
    for owner in owners:
        for name, param in owner._parameters.items():
            if param is None or param.device == device:  # a tied one already moved is skipped
                continue
            on_device = param.data.to(device, non_blocking=non_blocking)
            if torch._has_compatible_shallow_copy_type(param.data, on_device):
                host[(id(owner), name, "p")] = param.data
                param.data = on_device
            else:  # e.g. the meta device: a new Parameter in the slot, as the ledger does
                host[(id(owner), name, "s")] = param
                owner._parameters[name] = torch.nn.Parameter(on_device, requires_grad=param.requires_grad)
        for name, buffer in owner._buffers.items():
            if buffer is not None and buffer.device != device:
                host[(id(owner), name, "b")] = buffer
                owner._buffers[name] = buffer.to(device, non_blocking=non_blocking)
    return host


def _drop(owners: Sequence[torch.nn.Module], host: dict[tuple, torch.Tensor]) -> None:
    for owner in owners:
        for name, param in list(owner._parameters.items()):
            kept = host.get((id(owner), name, "p"))
            if param is not None and kept is not None:
                param.data = kept
            original = host.get((id(owner), name, "s"))
            if isinstance(original, torch.nn.Parameter):
                owner._parameters[name] = original
        for name in list(owner._buffers):
            kept = host.get((id(owner), name, "b"))
            if kept is not None:
                owner._buffers[name] = kept


def _device_tensors(owners: Sequence[torch.nn.Module]) -> list[torch.Tensor]:
    return [t for o in owners for t in (*o._parameters.values(), *o._buffers.values()) if t is not None]


class GroupStreamer:
    """The streamed groups of one model: forward hooks that move each in before its forward and out after.

    The hooks stay installed while the model is attached and act only while ``layout`` streams (the
    engine sets it when it places the model partly, and clears it when the model leaves the device).

    Args:
        model_id: The model's id.
        module: The model.
        is_partial: Whether the model is partly resident now (the ledger's answer).
        device: Where streamed groups go, or None on a bookkeeping device (bytes are only counted).
        copies: The side stream prefetches use (CUDA), or None.
        clock: The simulated clock, or None.
    """

    def __init__(
        self,
        model_id: str,
        module: torch.nn.Module,
        is_partial: Callable[[], bool],
        device: torch.device | None,
        copies: CopyStream | None,
        clock: SimulatedClock | None,
    ):
        self.model_id = model_id
        self.groups = tuple(split_groups(module))
        self.nbytes = sum(group.nbytes for group in self.groups)
        self.measured = self.nbytes  # the ledger's size of the model when it was split
        self._is_partial = is_partial
        self.layout: Layout | None = None
        self._device = device
        self._copies = copies
        self._clock = clock
        self._lock = threading.Lock()
        self._users: dict[int, int] = {}  # loaded group index -> forwards running it (0: prefetched)
        self._host: dict[int, dict[tuple, torch.Tensor]] = {}
        self._events: dict[int, object] = {}  # CUDA events of prefetches not yet waited on
        self.call_bytes = 0  # streamed during the calls since the last ``take_call_bytes``
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
        return self.layout is not None and index >= self.layout.resident and self._is_partial()

    def enter(self, index: int) -> None:
        """Before group ``index``'s forward: have it on the device (waiting for its prefetch if late)."""
        with self._lock:
            if not self._streamed(index):
                return
            assert self.layout is not None  # _streamed checked it
            if index not in self._users:
                self._drop_unused()
                self._load(index, early=False)
            else:
                self._wait(index)
            self._users[index] += 1
            if self._clock is not None:
                share = self.groups[index].nbytes / max(self.nbytes, 1)
                self._clock.compute((self.model_id, index), self._clock.seconds_for(self.model_id, share))
            following = index + 1
            if self.layout.slots > 1 and following < len(self.groups) and following not in self._users:
                self._load(following, early=True)

    def exit(self, index: int) -> None:
        """After group ``index``'s forward (also when it raised): drop it unless another forward runs it."""
        with self._lock:
            if index not in self._users:
                return
            self._users[index] -= 1
            if self._users[index] <= 0:
                self._unload(index)

    def end_call(self) -> None:
        """The model's call returned: drop what is still here (a prefetch its call did not use)."""
        with self._lock:
            self._drop_unused()

    def take_call_bytes(self) -> tuple[int, tuple[float, float] | None]:
        """Bytes streamed since the last take, and the span of those copies on the simulated clock."""
        with self._lock:
            nbytes, times = self.call_bytes, self.call_times
            self.call_bytes, self.call_times = 0, []
        span = (times[0][0], times[-1][1]) if times else None
        return nbytes, span

    # -- moves ---------------------------------------------------------------------------------
    def _load(self, index: int, early: bool) -> None:
        group = self.groups[index]
        if self._device is not None:
            if early and self._copies is not None:
                self._host[index], self._events[index] = self._copies.run(
                    lambda: _load(group.owners, self._device, True)  # type: ignore[arg-type]  # checked above
                )
            else:
                # Pinned host copies: the copy is queued on the compute stream, in order with the forward.
                self._host[index] = _load(group.owners, self._device, non_blocking=True)
        self._users[index] = 0
        self.call_bytes += group.nbytes
        if self._clock is not None:
            self.call_times.append(self._clock.copy((self.model_id, index), group.nbytes, early=early))

    def _wait(self, index: int) -> None:
        event = self._events.pop(index, None)
        if event is not None and self._copies is not None:
            self._copies.wait(event, _device_tensors(self.groups[index].owners))

    def _unload(self, index: int) -> None:
        self._events.pop(index, None)
        host = self._host.pop(index, None)
        if host is not None:
            _drop(self.groups[index].owners, host)
        del self._users[index]

    def _drop_unused(self) -> None:
        for index in [i for i, users in self._users.items() if users <= 0]:
            self._unload(index)
