"""Prefetch and the simulated clock: the copy of the next model (or group) overlaps the current forward."""

import logging

import pytest
import torch

from components import ComponentsManager
from offload import OffloadEngine, SimulatedDevice
from offload.partial.prefetch import prefetch_victims

from .helpers import MetaProbe, call, sized
from .test_streaming import GROUP, Tower, X

S = 4000  # bytes of each whole model; the bandwidth moves one per simulated second


def _two_models(prefetch: bool) -> OffloadEngine:
    a, b = sized(S), sized(S)
    device = SimulatedDevice(2 * S, h2d_bandwidth=S, compute_time={"a": 2.0, "b": 1.0})
    engine = OffloadEngine(device, memory_reserve_margin=0)
    engine.prefetch = prefetch
    engine.attach("a", a)
    engine.attach("b", b)
    engine.set_plan(["a", "b"])
    call(a)
    call(b)
    return engine


def test_without_prefetch_each_copy_waits_for_the_forward_before_it():
    engine = _two_models(prefetch=False)
    assert [(d.model_id, d.reason, d.start, d.end) for d in engine.log] == [
        ("a", "fits", 0.0, 1.0),
        ("b", "fits", 3.0, 4.0),  # issued once a's 2 s forward is done
    ]
    assert engine.simulated_clock.now == 5.0


def test_prefetch_copies_the_next_model_while_the_current_one_computes():
    """b's copy runs during a's forward: the wall time drops by the copy's second."""
    engine = _two_models(prefetch=True)
    assert [(d.model_id, d.reason, d.start, d.end) for d in engine.log] == [
        ("a", "fits", 0.0, 1.0),
        ("b", "prefetch", 1.0, 2.0),
    ]
    assert engine.simulated_clock.now == 4.0
    assert engine.log.total_bytes_to_device == 2 * S and engine.log.total_bytes_to_host == 0


def test_prefetch_never_evicts_the_running_model():
    """With room for one model, b cannot come in while a runs: it is placed when it is called."""
    a, b = sized(S), sized(S)
    expected = (call(a), call(b))
    engine = OffloadEngine(SimulatedDevice(S), memory_reserve_margin=0)
    engine.prefetch = True
    engine.attach("a", a)
    engine.attach("b", b)
    engine.set_plan(["a", "b"])
    assert torch.equal(call(a), expected[0]) and torch.equal(call(b), expected[1])
    assert [d.reason for d in engine.log] == ["fits", "evict: NextUseStrategy"]


def test_prefetch_victims_are_only_models_needed_later_than_the_target():
    assert prefetch_victims("c", S, {"a": S}, ("a", "c")) is None  # a is needed sooner than c
    assert prefetch_victims("c", S, {"a": S}, ("c", "a")) == ["a"]
    assert prefetch_victims("c", S, {"a": S, "x": S}, ("c", "a")) == ["x"]  # not needed at all goes first


def test_a_streamed_model_prefetches_its_next_group_and_saves_wall_time():
    """Same bytes, same output; with prefetch each group's copy overlaps the previous group's forward."""
    results = {}
    for prefetch in (False, True):
        tower = Tower(depth=4)
        expected = tower(X)
        device = SimulatedDevice(3 * GROUP, h2d_bandwidth=GROUP, compute_time={"tower": 5.0})
        engine = OffloadEngine(device, memory_reserve_margin=0)
        engine.prefetch = prefetch
        engine.attach("tower", tower)
        assert torch.equal(tower(X), expected)
        results[prefetch] = (engine.log.total_bytes_to_device, engine.simulated_clock.now)
    (bytes_off, wall_off), (bytes_on, wall_on) = results[False], results[True]
    # Each group takes 1 s to copy and 1 s to compute (5 s over 5 groups). Without prefetch, base and block 0
    # stay (one slot): 2 s copy, 2 s compute, then 3 blocks at 1 s copy + 1 s compute, each copy after the
    # forward before it. With prefetch (two slots) only the base stays: 1 s + 1 s, block 0's copy exposed,
    # then 4 forwards of 1 s whose next copies run beside them.
    assert bytes_off == bytes_on == 5 * GROUP
    assert wall_off == pytest.approx(2 + 2 + 3 * (1 + 1))
    assert wall_on == pytest.approx(1 + 1 + 1 + 4 * 1)


def test_with_real_moves_at_most_the_running_and_the_next_group_are_on_the_device():
    tower = Tower(depth=4)
    on_device = []

    def recording(forward):
        def record(*args):
            on_device.append(sum(block.weight.device.type == "meta" for block in tower.blocks))
            return forward(*args)

        return record

    for block in tower.blocks:
        block.forward = recording(block.forward)
    engine = OffloadEngine(MetaProbe(3 * GROUP), memory_reserve_margin=0)
    engine.prefetch = True
    engine.attach("tower", tower)
    tower(X)
    assert on_device == [2, 2, 2, 1]  # the running block and the prefetched next one; the last has none next
    assert all(block.weight.device.type == "cpu" for block in tower.blocks)


def _skips(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("prefetch skipped")]


def test_prefetch_where_two_groups_do_not_fit_streams_one_group_at_a_time_and_says_so_once(caplog):
    """Room for the base and one block only: with prefetch on, the model streams as without it (same bytes,
    same output), nothing raises, and the skipped prefetch is logged once, not per call or placement."""
    tower = Tower(depth=4)
    expected = tower(X)
    engine = OffloadEngine(SimulatedDevice(2 * GROUP), memory_reserve_margin=0)
    engine.prefetch = True
    with caplog.at_level(logging.WARNING, logger="offload.engine.engine"):
        engine.attach("tower", tower)
        engine.set_plan(["tower"])
        for _ in range(3):
            assert torch.equal(tower(X), expected)
        engine.evict("tower")  # placed again at the next call: still said once
        assert torch.equal(tower(X), expected)
    assert [d.reason for d in engine.log] == [
        "stream",
        *["stream tail"] * 3,
        "evict",
        "stream",
        "stream tail",
    ]
    assert engine.log[0].bytes_to_device == GROUP and engine.log[1].bytes_to_device == 4 * GROUP
    assert _skips(caplog) == [
        "prefetch skipped for tower on sim (budget 8448 B): the device has no room for two of its groups at "
        "once; its groups stream one at a time (said once per model)."
    ]


def test_prefetch_on_after_enable_keeps_a_manager_whose_model_streams_working(caplog):
    """The issue's case: offload on, the model streams; prefetch turned on, the next call still runs."""
    tower = Tower(depth=4)
    expected = tower(X)
    cm = ComponentsManager()
    cm.add("tower", tower)
    cm.enable_auto_cpu_offload(device=SimulatedDevice(2 * GROUP), memory_reserve_margin=0)
    assert torch.equal(tower(X), expected)
    cm.offload_engine.prefetch = True
    cm.set_execution_plan([tower])
    cm.offload_engine.evict(cm.get_id(tower))
    assert torch.equal(tower(X), expected)
    assert cm.offload_log[-2].reason == "stream"
    cm.disable_auto_cpu_offload()


class _Calling(torch.nn.Module):
    """One Linear group of its own, then a call of another attached model (a block calling a model)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.proj = torch.nn.Linear(X.shape[1], X.shape[1])
        self._inner = [inner]  # not a submodule: the inner model is attached on its own

    def forward(self, x):
        return self._inner[0](self.proj(x))


def test_prefetch_where_a_running_model_holds_the_room_for_a_second_group_streams_one(caplog):
    """A model streamed from inside a running one's forward: two of its groups fit the device, not beside the
    running model; it streams one group at a time then (said once) instead of failing."""
    tower = Tower(depth=4)
    outer = _Calling(tower)
    expected = outer(X)
    engine = OffloadEngine(SimulatedDevice(3 * GROUP), memory_reserve_margin=0)
    engine.prefetch = True
    engine.attach("outer", outer)
    engine.attach("tower", tower)
    with caplog.at_level(logging.WARNING, logger="offload.engine.engine"):
        for _ in range(2):
            assert torch.equal(outer(X), expected)
    assert [(d.model_id, d.reason, d.bytes_to_device // GROUP) for d in engine.log][:3] == [
        ("outer", "fits", 1),
        ("tower", "stream", 1),
        ("tower", "stream tail", 4),
    ]
    assert len(_skips(caplog)) == 1 and "running models hold the room for its next group" in _skips(caplog)[0]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"h2d_bandwidth": "fast"}, ValueError),
        ({"h2d_bandwidth": 0}, ValueError),
        ({"compute_time": {"a": -1.0}}, ValueError),
        ({"compute_time": [("a", 1.0)]}, TypeError),
    ],
)
def test_bad_clock_settings_are_refused_with_the_fix(kwargs, error):
    with pytest.raises(error, match="h2d_bandwidth|compute_time"):
        SimulatedDevice("1GB", **kwargs)


def test_bandwidth_reads_as_bytes_per_second():
    assert SimulatedDevice("1GB", h2d_bandwidth="25GB/s").h2d_bandwidth == 25 * 10**9


def test_real_time_moves_sleep_bytes_over_bandwidth(monkeypatch):
    slept = []
    monkeypatch.setattr("offload.devices.simulated.time.sleep", slept.append)
    device = SimulatedDevice("1GB", h2d_bandwidth="100MB/s", real_time=True)
    device.on_moved(50 * 10**6)
    device.on_moved(0)  # nothing moved: no wait
    SimulatedDevice("1GB", h2d_bandwidth="100MB/s").on_moved(10**6)  # the clock is simulated only
    assert slept == [0.5]


def test_real_time_without_a_bandwidth_is_refused():
    with pytest.raises(ValueError, match="give h2d_bandwidth"):
        SimulatedDevice("1GB", real_time=True)


def test_the_engine_tells_the_device_every_byte_its_log_counts_moved():
    moved = []

    class Counting(SimulatedDevice):
        def on_moved(self, nbytes):
            moved.append(nbytes)

    engine = OffloadEngine(Counting(S), memory_reserve_margin=0)
    models = {name: sized(S) for name in ("a", "b")}
    for name, model in models.items():
        engine.attach(name, model)
    for name in ("a", "b", "a"):  # the budget holds one: each placement after the first evicts the other
        call(models[name])
    assert len(moved) == 3 and sum(moved) == engine.log.total_bytes_to_device == 3 * S
