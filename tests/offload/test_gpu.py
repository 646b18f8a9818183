"""Real moves on CUDA: pinned host copies, zero bytes back, outputs equal to the model run without offload."""

import pytest
import torch

from offload import OffloadEngine

pytestmark = pytest.mark.gpu


def _linear(n: int, seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(n, n, bias=False)


def test_resident_weights_are_on_cuda_and_eviction_restores_the_pinned_host_copy():
    """A call moves weights to CUDA; eviction points them back at the same pinned host tensor."""
    module = _linear(256, 0)
    x = torch.randn(4, 256)
    expected = module.to("cuda")(x.to("cuda"))
    module.to("cpu")
    engine = OffloadEngine("cuda", memory_reserve_margin=0)
    engine.attach("m", module)
    host_ptr = module.weight.data_ptr()
    assert module.weight.is_pinned()
    out = module(x)
    assert module.weight.device.type == "cuda"
    assert torch.equal(out, expected)
    engine.evict("m")
    assert module.weight.device.type == "cpu" and module.weight.data_ptr() == host_ptr
    assert engine.log.total_bytes_to_host == 0


def test_a_real_budget_forces_next_use_eviction():
    """With a margin leaving room for one model, calling the second evicts the first, copying nothing back."""
    a, b = _linear(2048, 1), _linear(2048, 2)
    engine = OffloadEngine("cuda", memory_reserve_margin=0)
    size = 2048 * 2048 * 4
    engine.memory_reserve_margin = engine.probe.free_bytes() - int(1.5 * size)
    engine.attach("a", a)
    engine.attach("b", b)
    a(torch.randn(1, 2048))
    b(torch.randn(1, 2048))
    assert engine.resident_ids() == ["b"]
    assert engine.log[-1].evicted == ("a",)
    assert a.weight.device.type == "cpu" and engine.log.total_bytes_to_host == 0
    engine.close()
    assert b.weight.device.type == "cpu"


def test_a_weight_replaced_on_the_device_is_copied_back_not_lost():
    """A parameter swapped on CUDA without refresh is copied to the host on eviction and counted."""
    module = _linear(64, 3)
    engine = OffloadEngine("cuda", memory_reserve_margin=0)
    engine.attach("m", module)
    module(torch.randn(1, 64))
    module.extra = torch.nn.Parameter(torch.ones(8, device="cuda"))
    engine.evict("m")
    assert module.extra.device.type == "cpu" and torch.equal(module.extra.data, torch.ones(8))
    assert engine.log.total_bytes_to_host == 32
