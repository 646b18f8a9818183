"""Quantized weights (torchao's tensor subclasses) really move: their ``.data`` cannot be set, so the ledger
puts a device Parameter in the slot and keeps the original as the host copy, whole or streamed."""

import torch

from offload import OffloadEngine, module_nbytes

from .helpers import MetaProbe, Tower, quantized_tower

WIDTH = 64
X = torch.randn(2, WIDTH, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))


def host_weights(tower: Tower) -> list[tuple[type, int]]:
    return [(type(b.weight), b.weight.qdata.data_ptr()) for b in tower.blocks]


def run_on_meta(budget_share: float) -> tuple[OffloadEngine, Tower, torch.Tensor, list, list]:
    tower = quantized_tower(depth=8, width=WIDTH)
    expected, before = tower(X), host_weights(tower)
    engine = OffloadEngine(MetaProbe(int(budget_share * module_nbytes(tower))), memory_reserve_margin=0)
    engine.attach("tower", tower)
    seen = []

    def recording(block, forward):
        def record(*args):  # inside the forward, after the hooks moved the block's group in
            seen.append(block.weight.device.type)
            return forward(*args)

        return record

    for block in tower.blocks:
        block.forward = recording(block, block.forward)
    assert tower(X).device.type == "meta"  # the forward ran on the weights moved to the device
    return engine, tower, expected, before, seen


def test_a_quantized_model_moves_whole_and_comes_back_unchanged():
    engine, tower, expected, before, seen = run_on_meta(2.0)
    assert engine.log[0].reason == "fits" and set(seen) == {"meta"}
    engine.evict("tower")
    assert host_weights(tower) == before  # the same host tensors: nothing copied back
    engine.detach("tower")
    assert torch.equal(tower(X), expected) and engine.log.total_bytes_to_host == 0


def test_a_quantized_model_streams_its_tail():
    engine, tower, expected, before, seen = run_on_meta(0.4)
    assert [d.reason for d in engine.log] == ["stream", "stream tail"] and set(seen) == {"meta"}
    assert [b.weight.device.type for b in tower.blocks].count("cpu") > 0  # the streamed blocks went back
    engine.detach("tower")
    assert host_weights(tower) == before and torch.equal(tower(X), expected)
    assert engine.log.total_bytes_to_host == 0


def test_attaching_a_quantized_model_on_the_host_keeps_its_parameter_objects():
    """References a user took before attach keep pointing at the live weights."""
    tower = quantized_tower(depth=8, width=WIDTH)
    before = [block.weight for block in tower.blocks]
    engine = OffloadEngine(MetaProbe(2 * module_nbytes(tower)), memory_reserve_margin=0)
    engine.attach("tower", tower)
    assert all(block.weight is param for block, param in zip(tower.blocks, before))
    engine.detach("tower")
    assert all(block.weight is param for block, param in zip(tower.blocks, before))
