"""A model larger than what is free: its prefix stays resident, the rest streams in per forward."""

import threading

import pytest
import torch

from offload import ModelTooLargeError, OffloadEngine, SimulatedDevice
from offload.partial.groups import BASE, split_groups

from .helpers import GROUP, WIDTH, MetaProbe, Tower, X


def test_groups_are_the_base_then_each_block_and_hold_every_byte():
    """The split is diffusers' block rule: one group per ModuleList element, the rest in the base group."""
    tower = Tower(depth=3)
    groups = split_groups(tower)
    assert [g.name for g in groups] == [BASE, "blocks.0", "blocks.1", "blocks.2"]
    assert [g.nbytes for g in groups] == [GROUP] * 4
    assert groups[1].entry is tower.blocks[0] and groups[0].entry is None


def test_a_model_without_blocks_is_split_into_its_leaves():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    assert [g.name for g in split_groups(model)] == [BASE, "0", "2"]
    assert split_groups(model)[0].nbytes == 0


def test_a_weight_tied_across_two_blocks_moves_with_the_base_group():
    """Dropping one block must never pull a weight another block (or the base) still uses."""
    tower = Tower(depth=3)
    tower.blocks[2].weight = tower.blocks[0].weight
    names = [g.name for g in split_groups(tower)]
    assert names == [BASE, "blocks.1"]
    assert sum(g.nbytes for g in split_groups(tower)) == sum(p.nbytes for p in tower.parameters())


def test_a_model_four_times_the_budget_runs_equal_and_streams_its_tail_per_call():
    """Output bit-equal to no offload; each call streams (size - resident prefix) bytes; nothing copied back."""
    tower = Tower()
    expected = tower(X)
    size = 9 * GROUP
    engine = OffloadEngine(SimulatedDevice(size // 4), memory_reserve_margin=0)
    engine.attach("tower", tower)
    calls = 3
    for _ in range(calls):
        assert torch.equal(tower(X), expected)
    placed, *tails = list(engine.log)
    assert (
        placed.reason == "stream" and placed.bytes_to_device == GROUP
    )  # base + 1 slot fit; 2 blocks would not
    prefix = placed.bytes_to_device
    assert [t.reason for t in tails] == ["stream tail"] * calls
    assert all(t.bytes_to_device == size - prefix for t in tails)
    assert engine.log.total_bytes_to_device == prefix + (size - prefix) * calls
    assert engine.log.total_bytes_to_host == 0
    assert engine.residency("tower").resident_share == pytest.approx(prefix / size)
    assert engine.probe.used_bytes() <= size // 4


def test_the_prefix_grows_with_the_budget():
    """With room for half the model, the base and the first blocks stay; fewer bytes stream per call."""
    tower = Tower()
    expected = tower(X)
    engine = OffloadEngine(SimulatedDevice(5 * GROUP), memory_reserve_margin=0)
    engine.attach("tower", tower)
    assert torch.equal(tower(X), expected)
    assert engine.log[0].bytes_to_device == 4 * GROUP  # base + blocks 0-2, one slot for the 5 streamed
    assert engine.log[1].bytes_to_device == 5 * GROUP


def test_only_the_running_group_is_on_the_device_when_weights_really_move():
    """With real moves (a meta device), a streamed block is on the device during its forward only."""
    tower = Tower(depth=4)
    seen = []

    def recording(forward):
        def record(*args):
            seen.append([block.weight.device.type for block in tower.blocks])
            return forward(*args)

        return record

    for block in tower.blocks:  # inside the forward: after every forward hook ran
        block.forward = recording(block.forward)
    engine = OffloadEngine(MetaProbe(3 * GROUP), memory_reserve_margin=0)
    engine.attach("tower", tower)
    hosts = [(block.weight, block.weight.data_ptr()) for block in tower.blocks]
    tower(X)
    # base and block 0 resident; blocks 1-3 stream through one slot
    assert seen == [
        ["meta", "cpu", "cpu", "cpu"],
        ["meta", "meta", "cpu", "cpu"],
        ["meta", "cpu", "meta", "cpu"],
        ["meta", "cpu", "cpu", "meta"],
    ]
    assert [b.weight.device.type for b in tower.blocks] == ["meta", "cpu", "cpu", "cpu"]
    # the same parameters on the same host memory: nothing copied back
    assert all(
        b.weight is p and b.weight.data_ptr() == ptr for b, (p, ptr) in zip(tower.blocks[1:], hosts[1:])
    )
    engine.evict("tower")
    assert all(b.weight.device.type == "cpu" for b in tower.blocks) and engine.log.total_bytes_to_host == 0


def test_a_forward_that_raises_still_drops_its_group():
    tower = Tower(depth=2)
    engine = OffloadEngine(MetaProbe(2 * GROUP), memory_reserve_margin=0)
    engine.attach("tower", tower)

    def fail(module, args):
        raise RuntimeError("boom")

    handle = tower.blocks[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="boom"):
        tower(X)
    handle.remove()
    assert [b.weight.device.type for b in tower.blocks] == ["cpu", "cpu"]
    tower(X)  # and the next call streams as before
    assert engine.log[-1].reason == "stream tail"


@pytest.mark.parametrize("where", ["pre-hook", "forward"])
def test_a_keyboard_interrupt_mid_stream_still_drops_its_group(where):
    """A KeyboardInterrupt (Ctrl-C, or one raised by a step callback) is no Exception, so torch runs no
    ``always_call`` forward hook for it: the streamed group is dropped when the model's call ends instead. Nothing
    stays on the device, no forward counts as inside it, and the next calls stream as before, also in another
    thread."""
    tower = Tower(depth=2)
    engine = OffloadEngine(MetaProbe(2 * GROUP), memory_reserve_margin=0)
    engine.attach("tower", tower)
    expected_tail = (tower(X), engine.log[-1].bytes_to_device)

    def interrupt(*args):
        raise KeyboardInterrupt

    if where == "pre-hook":
        handle = tower.blocks[1].register_forward_pre_hook(interrupt)
    else:
        tower.blocks[1].forward, plain = interrupt, tower.blocks[1].forward
    with pytest.raises(KeyboardInterrupt):
        tower(X)
    if where == "pre-hook":
        handle.remove()
    else:
        tower.blocks[1].forward = plain
    assert [b.weight.device.type for b in tower.blocks] == ["cpu", "cpu"]
    assert engine.running_ids() == []
    for _ in range(2):
        out: list[torch.Tensor] = []
        thread = threading.Thread(target=lambda out=out: out.append(tower(X)))
        thread.start()
        thread.join(30)
        assert out and out[0].shape == expected_tail[0].shape  # meta tensors: the device holds no values
        assert (engine.log[-1].reason, engine.log[-1].bytes_to_device) == ("stream tail", expected_tail[1])
    assert [b.weight.device.type for b in tower.blocks] == ["cpu", "cpu"]


def test_a_group_that_cannot_fit_even_alone_is_named_and_nothing_moves():
    """The message names the group, its size and the budget; the log and the device stay empty."""
    tower = Tower(depth=2)
    tower.blocks[1] = torch.nn.Linear(WIDTH, 4 * WIDTH)  # the largest group
    device = SimulatedDevice(3 * GROUP)
    engine = OffloadEngine(device, memory_reserve_margin=0)
    engine.attach("tower", tower)
    with pytest.raises(ModelTooLargeError) as error:
        tower(X)
    text = str(error.value)
    assert (
        "model 'tower'" in text and "group 'blocks.1' (16896 B)" in text and f"budget {3 * GROUP} B" in text
    )
    assert len(engine.log) == 0 and device.used_bytes() == 0 and not engine.is_resident("tower")
    with pytest.raises(ModelTooLargeError, match=r"set_plan: .*'blocks\.1'.*Nothing was moved"):
        engine.set_plan(["tower"])


def test_streaming_is_chosen_when_evicting_would_move_more_bytes():
    """A denoiser and a control model both used every step do not fit together: the denoiser keeps a prefix
    beside the control model instead of both reloading at every step."""
    encoder, control, denoiser = Tower(depth=0, seed=1), Tower(depth=1, seed=3), Tower(depth=8, seed=2)
    models = {"encoder": encoder, "control": control, "denoiser": denoiser}
    steps = 6

    def call():
        out = [encoder(X)]
        for _ in range(steps):
            out += [control(X), denoiser(X)]
        return out

    expected = call()
    engine = OffloadEngine(SimulatedDevice(9 * GROUP), memory_reserve_margin=0)
    for model_id, model in models.items():
        engine.attach(model_id, model)
    engine.set_plan(["encoder", "control", "denoiser"])
    assert all(torch.equal(a, b) for a, b in zip(call(), expected))
    assert "stream" in [d.reason for d in engine.log]
    # Whole models would reload both every step: 11 groups a step. Streamed: the denoiser's tail, 3 groups
    # (2 for the control model, base + 5 blocks + one slot for the denoiser: 9 groups in all).
    tails = [d.bytes_to_device for d in engine.log if d.reason == "stream tail"]
    assert tails and all(t == 3 * GROUP for t in tails)
    # Before the loop is learned (first step) both move whole; the total is well under whole models'.
    assert engine.log.total_bytes_to_device < 0.6 * steps * 11 * GROUP
    assert engine.log.total_bytes_to_host == 0
