"""``OffloadEngine.expect_calls``: a caller that knows the calls to come (a server's queue) steers eviction."""

import pytest

from offload import OffloadEngine, SimulatedDevice
from tests.offload.helpers import call, sized


def _switched(expect: bool) -> OffloadEngine:
    """Five calls of pipeline A (a, b), then one of pipeline B (c, then d) on a device that holds A or B, not both."""
    engine = OffloadEngine(SimulatedDevice(400), memory_reserve_margin=0)
    modules = {"a": sized(200), "b": sized(100), "c": sized(100), "d": sized(200)}
    for name, module in modules.items():
        engine.attach(name, module)
    for _ in range(5):
        engine.set_plan(["a", "b"])
        call(modules["a"]), call(modules["b"])
    engine.set_plan(["c", "d"])
    if expect:
        engine.expect_calls([["c", "d"], ["c", "d"]])
    call(modules["c"]), call(modules["d"])
    return engine


def test_without_it_the_history_keeps_the_previous_pipeline():
    engine = _switched(expect=False)
    assert "c" not in engine.resident_ids()  # B's own encoder left for A's model, which the history used most
    assert "a" in engine.resident_ids()


def test_expected_calls_keep_what_comes_next():
    engine = _switched(expect=True)
    resident = set(engine.resident_ids())
    assert {"c", "d"} <= resident and "a" not in resident  # A's big model left: no call to come needs it


def test_clearing_it_returns_to_the_history():
    engine = _switched(expect=True)
    engine.expect_calls(())
    assert engine._placer.expected == ()


def test_expect_calls_takes_ids_only():
    engine = OffloadEngine(SimulatedDevice(100), memory_reserve_margin=0)
    with pytest.raises(TypeError, match="expect_calls takes plans of model ids"):
        engine.expect_calls([[object()]])
    assert engine._placer.expected == ()
