"""Recording a run's model uses, replaying them with another strategy, and a budget on a real device."""

import pytest
import torch

from offload import LRUStrategy, NextUseStrategy, OffloadEngine, SimulatedDevice, SmallestSufficientSet
from offload.devices.budget import BudgetedDevice
from offload.devices.probes import DeviceProbe
from offload.engine.replay import UseRecorder, meta_module, replay

from .helpers import GROUP, Tower, call, sized

SIZES = {"a": 400, "b": 800, "c": 1200}


def _engine(strategy=None):
    engine = OffloadEngine(SimulatedDevice(2000), memory_reserve_margin=0, strategy=strategy)
    modules = {name: sized(nbytes) for name, nbytes in SIZES.items()}
    for name, module in modules.items():
        engine.attach(name, module)
    return engine, modules


def _work(engine, modules):
    engine.set_plan(["a", "b", "c"])
    for name in ("a", "b", "b", "c", "a", "c"):
        call(modules[name])


def test_recorder_sees_every_use_and_plan_and_what_was_resident():
    """Every hooked call is a use (hits too), with the residents after it; plans are recorded in order."""
    engine, modules = _engine()
    with UseRecorder(engine) as recorder:
        _work(engine, modules)
    assert recorder.events == [("plan", ("a", "b", "c"))] + [
        ("use", m) for m in ("a", "b", "b", "c", "a", "c")
    ]
    assert [use.model_id for use in recorder.uses] == ["a", "b", "b", "c", "a", "c"]
    assert all(sum(use.resident.values()) <= 2000 for use in recorder.uses)
    assert recorder.uses[1].resident == {"a": 400, "b": 800}
    assert recorder.sizes == SIZES


def test_recorder_counts_a_partly_resident_model_at_its_bytes_on_the_device():
    """A victim shrunk to a prefix, and a model streaming its tail, are recorded at the bytes they keep on
    the device, not their whole size, so the residents of every use fit the device."""
    engine = OffloadEngine(SimulatedDevice(9 * GROUP), memory_reserve_margin=0)
    models = {"encoder": Tower(depth=5, seed=1), "a": Tower(depth=5, seed=2), "big": Tower(depth=13, seed=3)}
    for name, module in models.items():
        engine.attach(name, module)
    x = torch.ones(1, 32)
    with UseRecorder(engine) as recorder:
        engine.set_plan(["encoder", "a"])
        models["encoder"](x)
        models["a"](x)  # the encoder keeps 3 of its 6 groups (offload.partial.shrink)
        engine.set_plan(["big"])
        models["big"](x)  # 14 groups on 9: it streams, its base and 7 blocks resident
    assert [use.resident for use in recorder.uses] == [
        {"encoder": 6 * GROUP},
        {"encoder": 3 * GROUP, "a": 6 * GROUP},
        {"big": 8 * GROUP},
    ]
    assert engine.residency("big").resident_share == 8 / 14
    assert recorder.sizes == {"encoder": 6 * GROUP, "a": 6 * GROUP, "big": 14 * GROUP}


def test_recorder_leaves_the_engine_as_it_found_it():
    """After the with block the engine's own methods answer again; later uses are not recorded."""
    engine, modules = _engine()
    with UseRecorder(engine) as recorder:
        call(modules["a"])
    call(modules["b"])
    assert "ensure_resident" not in vars(engine) and "set_plan" not in vars(engine)
    assert engine.watchers == []
    assert [use.model_id for use in recorder.uses] == ["a"]


@pytest.mark.parametrize("strategy", [NextUseStrategy, LRUStrategy, SmallestSufficientSet])
def test_replay_with_the_same_strategy_reproduces_the_run(strategy):
    """Replaying recorded events with the run's strategy gives the run's bytes, evictions and peak."""
    engine, modules = _engine(strategy())
    with UseRecorder(engine) as recorder:
        _work(engine, modules)
    result = replay(recorder.events, recorder.sizes, 2000, 0, strategy())
    log = engine.log
    assert (result.bytes_to_device, result.bytes_to_host, result.evictions, result.peak_resident_bytes) == (
        log.total_bytes_to_device,
        0,
        log.total_evictions,
        engine.peak_resident_bytes,
    )
    assert result.evictions > 0


def test_replay_counts_evicted_bytes_as_copied_back_for_a_copying_rule():
    """With copies_back=True every evicted byte counts device-to-host, as the peer's module.to('cpu') does."""
    events = [("use", "a"), ("use", "b"), ("use", "c"), ("use", "a")]
    result = replay(events, SIZES, 2000, 0, SmallestSufficientSet(), copies_back=True)
    assert result.strategy == "SmallestSufficientSet"
    assert result.bytes_to_host == 400 + 800  # c evicts a (the smallest that frees enough), a evicts b
    assert result.evictions == 2


def test_replay_refuses_a_use_of_an_unknown_model():
    """A use of a model that sizes does not list is a KeyError naming both."""
    with pytest.raises(
        KeyError, match=r"replay: use of 'd', which sizes does not list \(it lists \['a', 'b', 'c'\]\)"
    ):
        replay([("use", "d")], SIZES, 2000, 0, NextUseStrategy())


def test_meta_module_has_exact_bytes_and_allocates_nothing():
    """meta_module(n) weighs n bytes on the meta device."""
    module = meta_module(12345)
    assert module.weight.device == torch.device("meta") and module.weight.numel() == 12345


def test_budgeted_device_caps_free_memory_at_the_budget(monkeypatch):
    """A budgeted device reports the smaller of the device's free bytes and the budget less its residents."""
    monkeypatch.setattr(DeviceProbe, "free_bytes", lambda self: 10_000)
    monkeypatch.setattr(DeviceProbe, "total_bytes", lambda self: 50_000)
    device = BudgetedDevice("cuda:0", "3KB")
    assert (device.free_bytes(), device.total_bytes()) == (3000, 3000)
    device.on_resident("x", 1000)
    assert device.free_bytes() == 2000 and device.used_bytes() == 1000
    device.on_evicted("x")
    assert device.free_bytes() == 3000
    assert repr(device) == "BudgetedDevice('cuda:0', budget='3000 B')"
    monkeypatch.setattr(DeviceProbe, "free_bytes", lambda self: 500)
    assert device.free_bytes() == 500


def test_engine_watchers_are_told_every_plan_and_use_in_order():
    """A watcher gets ("plan", ids) after set_plan and ("use", id) after each ensure_resident, hits too."""
    engine, modules = _engine()
    told = []
    engine.watchers.append(lambda kind, value: told.append((kind, value)))
    _work(engine, modules)
    assert told == [("plan", ("a", "b", "c"))] + [("use", m) for m in ("a", "b", "b", "c", "a", "c")]
