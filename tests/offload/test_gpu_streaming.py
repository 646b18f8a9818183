"""Streaming and prefetch on real CUDA: outputs equal to the model run without offload, nothing copied back."""

import pytest
import torch

from offload import OffloadEngine

from .helpers import Tower, quantized_tower

pytestmark = pytest.mark.gpu

WIDTH = 1024
BLOCK = (WIDTH * WIDTH + WIDTH) * 4


def _expected(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = module.to("cuda")(x.to("cuda"))
    module.to("cpu")
    return out


def _engine(budget: int, prefetch: bool) -> OffloadEngine:
    engine = OffloadEngine("cuda", memory_reserve_margin=0)
    engine.memory_reserve_margin = engine.probe.free_bytes() - budget
    engine.prefetch = prefetch
    return engine


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_model_four_times_the_budget_streams_on_cuda_with_equal_output(prefetch):
    tower = Tower(depth=7, seed=0, width=WIDTH)
    x = torch.randn(4, WIDTH)
    expected = _expected(tower, x)
    engine = _engine(2 * BLOCK + BLOCK // 2, prefetch)  # 8 groups: a quarter fits
    engine.attach("tower", tower)
    for _ in range(3):
        assert torch.equal(tower(x), expected)
    assert engine.log[0].reason == "stream"
    tails = [d.bytes_to_device for d in engine.log if d.reason == "stream tail"]
    assert len(tails) == 3 and len(set(tails)) == 1
    assert engine.log.total_bytes_to_host == 0
    streamed = [b for b in tower.blocks if b.weight.device.type == "cpu"]
    assert streamed and all(b.weight.is_pinned() for b in streamed)  # streamed groups read the pinned copy
    engine.close()
    assert all(p.device.type == "cpu" for p in tower.parameters())


def test_prefetch_of_the_next_whole_model_gives_equal_outputs():
    """b is copied on a side stream while a computes; b's forward waits on the copy's event."""
    a, b = Tower(depth=2, seed=1, width=WIDTH), Tower(depth=2, seed=2, width=WIDTH)
    x = torch.randn(4, WIDTH)
    expected_a = _expected(a, x)
    expected_b = _expected(b, expected_a.cpu())
    engine = _engine(8 * BLOCK, prefetch=True)
    engine.attach("a", a)
    engine.attach("b", b)
    for _ in range(3):
        engine.set_plan(["a", "b"])
        out_a = a(x)
        out_b = b(out_a)
        assert torch.equal(out_a, expected_a) and torch.equal(out_b, expected_b)
    assert "prefetch" in [d.reason for d in engine.log]
    assert engine.log.total_bytes_to_host == 0
    engine.close()


def test_a_streamed_model_and_a_control_model_in_a_loop_equal_no_offload():
    control, denoiser = Tower(depth=1, seed=3, width=WIDTH), Tower(depth=8, seed=4, width=WIDTH)
    x = torch.randn(4, WIDTH)
    expected = []
    for model in (control, denoiser):
        model.to("cuda")
    h = x.to("cuda")
    for _ in range(4):
        h = denoiser(control(h))
        expected.append(h)
    control.to("cpu")
    denoiser.to("cpu")
    engine = _engine(9 * BLOCK, prefetch=True)
    engine.attach("control", control)
    engine.attach("denoiser", denoiser)
    engine.set_plan(["control", "denoiser"])
    h = x
    for step in range(4):
        h = denoiser(control(h))
        assert torch.equal(h, expected[step])
    assert engine.log.total_bytes_to_host == 0
    engine.close()


@pytest.mark.parametrize("budget_blocks", [None, 2.5])
def test_a_torchao_quantized_model_moves_whole_and_streamed_on_cuda(budget_blocks):
    """torchao's tensors cannot take ``.data =``: they move by slot; outputs equal the model on CUDA."""
    tower = quantized_tower(depth=7, width=WIDTH)
    x = torch.randn(4, WIDTH, dtype=torch.bfloat16)
    expected = _expected(tower, x)
    nbytes = sum(p.nbytes for p in tower.parameters())
    engine = _engine(int(budget_blocks * nbytes / 8) if budget_blocks else 2 * nbytes, prefetch=False)
    engine.attach("tower", tower)
    for _ in range(2):
        assert torch.equal(tower(x), expected)
    assert engine.log[0].reason == ("stream" if budget_blocks else "fits")
    assert engine.log.total_bytes_to_host == 0
    engine.close()
    assert all(p.device.type == "cpu" for p in tower.parameters())
