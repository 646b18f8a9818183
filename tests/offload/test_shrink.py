"""A victim shrunk to a resident prefix instead of evicted whole, when that moves fewer bytes."""

import pytest
import torch

from offload import LRUStrategy, ModelTooLargeError, OffloadEngine, SimulatedDevice

from .helpers import GROUP, MetaProbe, Tower, X


def _engine(device, strategy=None, shrink=True):
    """An encoder and two denoisers of 6 groups each (base + 5 blocks) on ``device``."""
    engine = OffloadEngine(device, memory_reserve_margin=0)
    engine.shrink_victims = shrink
    if strategy is not None:
        engine.set_strategy(strategy)
    models = {"encoder": _encoder(), "a": Tower(depth=5, seed=2), "b": Tower(depth=5, seed=3)}
    for model_id, model in models.items():
        engine.attach(model_id, model)
    return engine, models


def _encoder():
    return Tower(depth=5, seed=1)


def _three_calls(engine, models):
    """Two workflows sharing the encoder, as the seed's Flux workflows share T5: a, b, a."""
    outputs = []
    for denoiser in ("a", "b", "a"):
        engine.set_plan(["encoder", denoiser])
        outputs.append(models["encoder"](X))
        for _ in range(3):
            outputs.append(models[denoiser](X))
    return outputs


def test_a_victim_needed_again_keeps_a_prefix_and_only_its_tail_comes_back():
    """9 groups of room: a denoiser needs 6 with 3 free, so the encoder keeps 3 groups instead of leaving
    whole, and at the next call only its 3-group tail moves in. Outputs equal the run without offload;
    bytes are exact (30 groups, against 36 with whole victims); nothing is copied back."""
    plain = {"encoder": _encoder(), "a": Tower(depth=5, seed=2), "b": Tower(depth=5, seed=3)}
    expected = [
        plain[m](X) for m in ("encoder", "a", "a", "a", "encoder", "b", "b", "b", "encoder", "a", "a", "a")
    ]
    engine, models = _engine(SimulatedDevice(9 * GROUP))
    outputs = _three_calls(engine, models)
    assert all(torch.equal(out, want) for out, want in zip(outputs, expected, strict=True))
    moves = [(d.model_id, d.reason, d.evicted, d.bytes_to_device // GROUP) for d in engine.log]
    assert moves == [
        ("encoder", "fits", (), 6),
        ("encoder", "shrink", (), 0),  # kept: its base and 2 blocks
        ("a", "evict: NextUseStrategy", (), 6),
        ("a", "shrink", (), 0),  # a runs again in the third call
        ("encoder", "evict: NextUseStrategy", (), 3),  # only its tail
        ("b", "evict: NextUseStrategy", ("encoder",), 6),
        ("encoder", "evict: NextUseStrategy", ("b",), 6),
        ("encoder", "shrink", (), 0),
        ("a", "evict: NextUseStrategy", (), 3),  # only its tail
    ]
    assert engine.log.total_bytes_to_device == 30 * GROUP
    assert engine.log.total_bytes_to_host == 0
    assert engine.residency("encoder").resident_share == 0.5
    assert engine.residency("a").resident_share is None  # whole again
    assert engine.probe.used_bytes() == 9 * GROUP


def test_the_log_counts_victims_shrunk_to_a_prefix_among_the_models_that_left_the_device():
    """Two victims left whole and three down to a prefix: the totals and the printed summary say 5 left, not
    "evictions 2"."""
    engine, models = _engine(SimulatedDevice(9 * GROUP))
    _three_calls(engine, models)
    log = engine.log
    assert (log.total_evictions, log.total_shrinks, log.total_left_device) == (2, 3, 5)
    assert str(log).splitlines()[-1] == (
        f"total: to device {30 * GROUP} B, to host 0 B, left the device 5 (2 whole, 3 shrunk to a prefix)"
    )
    log.clear()
    assert (log.total_evictions, log.total_shrinks, log.total_left_device) == (0, 0, 0)


def test_on_by_default_and_turned_off_victims_leave_whole():
    """``shrink_victims`` is on by default; turned off, the same calls evict whole models: 36 groups."""
    assert OffloadEngine(SimulatedDevice(GROUP)).shrink_victims is True
    engine, models = _engine(SimulatedDevice(9 * GROUP), shrink=False)
    _three_calls(engine, models)
    assert "shrink" not in [d.reason for d in engine.log]
    assert engine.log.total_bytes_to_device == 36 * GROUP


def test_a_strategy_that_keeps_victims_whole_evicts_them_whole():
    """Only strategies that allow it shrink victims (LRU does not): the same calls move whole models."""
    engine, models = _engine(SimulatedDevice(9 * GROUP), LRUStrategy())
    _three_calls(engine, models)
    assert "shrink" not in [d.reason for d in engine.log]
    assert all(d.evicted for d in engine.log if d.reason.startswith("evict"))


def test_no_shrink_when_no_plan_needs_the_victim_again():
    """Without a plan nothing says the encoder comes back: keeping a prefix would save nothing; evicted whole."""
    engine, models = _engine(SimulatedDevice(9 * GROUP))
    models["encoder"](X)
    models["a"](X)
    assert [(d.reason, d.evicted) for d in engine.log][-1] == ("evict: NextUseStrategy", ("encoder",))
    assert not engine.is_resident("encoder")


def test_no_shrink_when_the_surplus_cannot_hold_the_base_group():
    """With exactly the room the denoiser needs once the encoder leaves, no prefix fits: evicted whole."""
    engine, models = _engine(SimulatedDevice(6 * GROUP))
    _three_calls(engine, models)
    assert "shrink" not in [d.reason for d in engine.log]
    assert engine.log.total_bytes_to_device == 36 * GROUP


def test_victims_that_alternate_with_the_model_placed_are_not_shrunk_once_the_loop_is_known():
    """A control model and a denoiser used in turn every step: shrinking one would make its tail evict the
    other at every step. Once the loop is learned (after the first step) nothing is shrunk: the denoiser
    streams, and two calls move exactly the bytes they move with whole victims."""
    totals = []
    for shrink in (True, False):
        engine = OffloadEngine(SimulatedDevice(9 * GROUP), memory_reserve_margin=0)
        engine.shrink_victims = shrink
        encoder, control, denoiser = Tower(depth=0, seed=1), Tower(depth=1, seed=3), Tower(depth=8, seed=2)
        for model_id, model in {"encoder": encoder, "control": control, "denoiser": denoiser}.items():
            engine.attach(model_id, model)
        for _ in range(2):
            engine.set_plan(["encoder", "control", "denoiser"])
            encoder(X)
            for _ in range(6):
                control(X)
                denoiser(X)
        reasons = [d.reason for d in engine.log]
        assert "stream" in reasons
        shrunk = [d.model_id for d in engine.log if d.reason == "shrink"]
        # The denoiser at the first step, before the loop is known; control at the next call's encoder
        # (it runs again only after the encoder is done). Never one of the pair while the loop runs.
        assert shrunk == (["denoiser", "control"] if shrink else [])
        totals.append(engine.log.total_bytes_to_device)
    assert totals[0] == totals[1]


def _alternating_calls(shrink, depths, room, uses, calls=4):
    """Two towers ``a`` and ``b`` used in turn, ``uses`` times each per call, by a workflow run ``calls``
    times on ``room`` groups of device; returns the engine and every output."""
    engine = OffloadEngine(SimulatedDevice(room * GROUP), memory_reserve_margin=0)
    engine.shrink_victims = shrink
    models = {"a": Tower(depth=depths[0], seed=1), "b": Tower(depth=depths[1], seed=2)}
    for model_id, model in models.items():
        engine.attach(model_id, model)
    outputs = []
    for _ in range(calls):
        engine.set_plan(["a", "b"])
        for model_id, count in zip("ab", uses):
            outputs += [models[model_id](X) for _ in range(count)]
    return engine, outputs


def test_two_models_of_a_repeated_workflow_do_not_keep_shrinking_each_other():
    """a and b (8 groups each) never fit together in 10 groups. Shrinking each to bring the other's tail
    back would move 6 + 6 groups every call (52 in 4 calls); once a's tail is priced against streaming it,
    a streams (7 groups a call) and b stays: 38 groups, exactly what whole victims move. Outputs equal the
    run without offload."""
    plain = {"a": Tower(depth=7, seed=1), "b": Tower(depth=7, seed=2)}
    expected = [plain[m](X) for m in "ab" * 4]
    engine, outputs = _alternating_calls(True, (7, 7), 10, (1, 1))
    whole, _ = _alternating_calls(False, (7, 7), 10, (1, 1))
    assert all(torch.equal(out, want) for out, want in zip(outputs, expected, strict=True))
    moves = [(d.model_id, d.reason, d.evicted, d.bytes_to_device // GROUP) for d in engine.log]
    assert moves[:5] == [
        ("a", "fits", (), 8),
        ("a", "shrink", (), 0),  # a's next call is priced only when it comes
        ("b", "evict: NextUseStrategy", (), 8),
        ("a", "evict", ("a",), 0),  # its prefix leaves: streaming beats evicting b for its tail
        ("a", "stream", (), 1),
    ]
    assert [d.model_id for d in engine.log if d.reason == "shrink"] == ["a"]
    assert engine.log.total_bytes_to_device == whole.log.total_bytes_to_device == 38 * GROUP
    assert engine.log.total_bytes_to_host == 0


@pytest.mark.parametrize(
    ("depths", "room", "uses"),
    [((7, 7), 10, (1, 1)), ((6, 7), 14, (2, 1)), ((2, 7), 10, (2, 3)), ((7, 6), 9, (1, 3))],
)
def test_alternating_models_move_no_more_bytes_with_shrinking_than_without(depths, room, uses):
    """Two models that do not fit together, used in turn by a repeated workflow: with shrinking on, bytes
    moved are not above whole victims' (each of these moved more before a shrunk tail was priced against
    streaming), and nothing is copied back."""
    shrunk, outputs = _alternating_calls(True, depths, room, uses)
    whole, expected = _alternating_calls(False, depths, room, uses)
    assert all(torch.equal(out, want) for out, want in zip(outputs, expected, strict=True))
    assert "shrink" in [d.reason for d in shrunk.log]
    assert shrunk.log.total_bytes_to_device <= whole.log.total_bytes_to_device
    assert shrunk.log.total_bytes_to_host == 0


def test_the_tail_really_leaves_and_comes_back_and_the_host_copies_are_kept():
    """With real moves (a meta device): after the shrink the encoder's base and first 2 blocks stay on the
    device and its last 3 blocks are back on their own host tensors; its next use brings them back; evicting
    it puts every weight on the same host memory as before (nothing copied back)."""
    engine, models = _engine(MetaProbe(9 * GROUP))
    encoder = models["encoder"]
    hosts = [(p, p.data_ptr()) for p in encoder.parameters()]
    engine.set_plan(["encoder", "a"])
    engine.ensure_resident("encoder")
    engine.ensure_resident("a")
    assert [b.weight.device.type for b in encoder.blocks] == ["meta", "meta", "cpu", "cpu", "cpu"]
    assert encoder.inp.weight.device.type == "meta"
    assert engine.residency("encoder").resident_share == 0.5
    engine.set_plan(["encoder", "b"])
    engine.ensure_resident("encoder")  # its tail comes back beside a (now shrunk in turn)
    assert all(p.device.type == "meta" for p in encoder.parameters())
    engine.evict("encoder")
    assert all(p is q and p.data_ptr() == ptr for p, (q, ptr) in zip(encoder.parameters(), hosts))
    assert engine.log.total_bytes_to_host == 0


def test_a_shrunk_model_whose_tail_finds_no_room_beside_its_own_running_model_fails_and_moves_nothing():
    """The encoder, shrunk, is called from inside a's forward: a is running and holds the room, so the tail
    cannot come back. The error names the models and the fix, and nothing moved: the prefix is still there."""
    engine, models = _engine(SimulatedDevice(9 * GROUP))
    engine.set_plan(["encoder", "a"])
    models["encoder"](X)
    models["a"](X)
    before = (len(engine.log), engine.probe.used_bytes(), engine.residency("encoder").resident_share)
    inside = models["a"].blocks[0]  # a block's hook runs inside a's forward, a placed and running
    handle = inside.register_forward_pre_hook(lambda module, args: models["encoder"](X))
    try:
        with pytest.raises(ModelTooLargeError, match=r"'encoder'.*'a'"):
            models["a"](X)
    finally:
        handle.remove()
    assert (len(engine.log), engine.probe.used_bytes(), engine.residency("encoder").resident_share) == before
