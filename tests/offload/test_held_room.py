"""On a real device the room a streaming model holds for its streamed groups is free to the driver between
forwards; the probe must not offer it to another model, or the next streamed group has nowhere to go."""

import torch

from offload import DeviceProbe, OffloadEngine

from .helpers import GROUP, WIDTH, Tower, X


class MetaDriver(DeviceProbe):
    """A device probe over the ``meta`` device whose driver reports the budget less the bytes of the meta
    tensors the watched modules really hold: what ``mem_get_info`` reports on CUDA, without a GPU."""

    def __init__(self, budget: int, modules: list[torch.nn.Module]):
        self._device = torch.device("meta")
        self._held = {}
        self.budget, self.modules = budget, modules

    def allocated(self) -> int:
        tensors = {
            t for m in self.modules for t in [*m.parameters(), *m.buffers()] if t.device.type == "meta"
        }
        return sum(t.nbytes for t in tensors)

    def _driver_free(self) -> int:
        return self.budget - self.allocated()

    def total_bytes(self) -> int:
        return self.budget


def test_room_held_for_streamed_groups_is_not_given_to_another_model():
    """After a streamed call, its slot is empty; a model that would fit only in that slot makes room by
    evicting or shrinking instead, and the next streamed call never allocates past the device."""
    tower, other = Tower(), torch.nn.Linear(WIDTH, WIDTH)
    device = MetaDriver(9 * GROUP // 4, [tower, other])  # the base group and one slot fit
    engine = OffloadEngine(device, memory_reserve_margin=0)
    engine.attach("tower", tower)
    engine.attach("other", other)
    peaks = []
    for block in tower.blocks:
        block.register_forward_hook(lambda *_: peaks.append(device.allocated()))
    tower(X)
    assert engine.log[0].reason == "stream"
    assert device.free_bytes() == 9 * GROUP // 4 - 2 * GROUP  # the empty slot is not free
    other(X[:, :WIDTH])
    tower(X)
    assert max(peaks) <= device.budget
    assert engine.log[2].model_id == "other" and engine.log[2].evicted == ("tower",)


def test_the_hold_ends_when_the_model_leaves_the_device():
    tower = Tower(depth=4)
    device = MetaDriver(3 * GROUP, [tower])
    engine = OffloadEngine(device, memory_reserve_margin=0)
    engine.attach("tower", tower)
    tower(X)
    assert device._held == {"tower": GROUP}
    engine.evict("tower")
    assert device._held == {} and device.free_bytes() == 3 * GROUP
