"""WatermarkStrategy: device use grows to the high watermark untouched, and evictions bring it down to low."""

import re

import pytest
import torch

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from offload import (
    ModelTooLargeError,
    OffloadEngine,
    OffloadRequest,
    SimulatedDevice,
    WatermarkStrategy,
    module_nbytes,
)

from ..modular.tiny_sd import tiny_sd_images, tiny_sd_pipeline
from .helpers import Tower, call, sized


def engine_with(budget, sizes, strategy, margin=0):
    engine = OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=margin, strategy=strategy)
    modules = {name: sized(n) for name, n in sizes.items()}
    for name, module in modules.items():
        engine.attach(name, module)
    return engine, modules


def used(engine):
    return engine.probe.used_bytes()


def test_use_grows_to_high_without_evicting_then_falls_to_low():
    """Below high nothing is evicted; the model that would pass high evicts (LRU without a plan) down to low."""
    engine, modules = engine_with(1000, {"a": 200, "b": 200, "c": 200, "d": 300}, WatermarkStrategy(500, 800))
    for name in ("a", "b", "c"):
        call(modules[name])
    assert [entry.reason for entry in engine.log] == ["fits"] * 3 and used(engine) == 600
    call(modules["d"])  # 900 would pass high (800), though the device has room for it
    assert engine.log[-1].evicted == ("a", "b")
    assert engine.log[-1].reason == "evict: WatermarkStrategy"
    assert engine.resident_ids() == ["c", "d"] and used(engine) == 500


def test_the_default_strategy_would_not_evict_at_all():
    """The contrast: NextUseStrategy places the same model without evicting, as the device has room."""
    engine, modules = engine_with(1000, {"a": 200, "b": 200, "c": 200, "d": 300}, None)
    for name in ("a", "b", "c", "d"):
        call(modules[name])
    assert not any(entry.evicted for entry in engine.log) and used(engine) == 900


def test_victims_follow_the_plan_when_there_is_one():
    """With a plan, the models needed furthest ahead go first (NextUseStrategy's order)."""
    engine, modules = engine_with(1000, {"a": 200, "b": 200, "c": 200, "d": 300}, WatermarkStrategy(500, 800))
    engine.set_plan(["a", "b", "c", "d", "a", "b"])
    for name in ("a", "b", "c", "d"):
        call(modules[name])
    assert engine.log[-1].evicted == ("c", "b")  # c is not needed again, b after a
    assert engine.resident_ids() == ["a", "d"] and used(engine) == 500


def test_fractions_of_the_device_resolve_against_its_total():
    """low=0.5 and high=0.8 of a 1000-byte device act as 500 and 800 bytes."""
    engine, modules = engine_with(1000, {"a": 200, "b": 200, "c": 200, "d": 300}, WatermarkStrategy(0.5, 0.8))
    for name in ("a", "b", "c", "d"):
        call(modules[name])
    assert engine.log[-1].evicted == ("a", "b") and used(engine) == 500


def test_a_larger_margin_wins_over_high():
    """The engine keeps free the larger of its margin and total - high: a 300-byte margin beats high=900."""
    sizes = {"a": 200, "b": 200, "c": 200, "d": 200}
    engine, modules = engine_with(1000, sizes, WatermarkStrategy(400, 900), margin=300)
    for name in ("a", "b", "c", "d"):
        call(modules[name])
    assert engine.log[-1].evicted == ("a", "b") and used(engine) == 400  # 600 + 200 > 1000 - 300


def test_when_low_cannot_be_reached_every_evictable_model_goes():
    """A model larger than low leaves the device to itself; use is as low as it can be."""
    engine, modules = engine_with(1000, {"a": 200, "b": 200, "c": 600}, WatermarkStrategy(100, 800))
    call(modules["a"])
    call(modules["b"])
    call(modules["c"])
    assert engine.log[-1].evicted == ("a", "b") and engine.resident_ids() == ["c"]


def test_a_request_without_the_device_use_frees_only_the_shortfall():
    """Asked without device_used (as streaming's cost estimate asks), it frees what is needed and no more."""
    request = OffloadRequest(
        model_id="d", nbytes=300, free=100, residents={"a": 200, "b": 200}, last_used={"a": 1, "b": 2}
    )
    assert WatermarkStrategy(100, 800).select_victims(request) == ["a"]
    aimed = OffloadRequest(
        model_id="d",
        nbytes=300,
        free=100,
        residents={"a": 200, "b": 200},
        last_used={"a": 1, "b": 2},
        device_total=1000,
        device_used=700,
    )
    assert WatermarkStrategy(100, 800).select_victims(aimed) == ["a", "b"]


def test_a_tiny_sd_pipeline_keeps_its_outputs_and_stays_between_the_watermarks(tmp_path):
    """Outputs equal the run without offload; use never passes high and each eviction ends at or below low."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(make_tiny_repo(tmp_path / "repo"), cm)

    def run():
        return tiny_sd_images(pipe)

    expected = run()
    sizes = {name: module_nbytes(getattr(pipe, name)) for name in ("text_encoder", "unet", "vae")}
    budget = sum(sizes.values())  # room for all: only the watermarks evict
    # The VAE passes high after the encoder and UNet; low holds the UNet alone, so every eviction can reach it.
    low, high = sizes["unet"] + sizes["text_encoder"] // 2, sizes["text_encoder"] + sizes["unet"]
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(budget), memory_reserve_margin=0, offload_strategy=WatermarkStrategy(low, high)
    )
    for _ in range(2):
        assert torch.equal(run(), expected)
    log = list(cm.offload_log)
    assert all(budget - entry.free_after <= high for entry in log)
    evictions = [entry for entry in log if entry.reason == "evict: WatermarkStrategy"]
    assert evictions and all(budget - entry.free_after <= low for entry in evictions)
    assert sum(entry.bytes_to_host for entry in log) == 0


@pytest.mark.parametrize(
    ("low", "high", "error", "message"),
    [
        ("6GB", "2GB", ValueError, r"low \('6GB': 5.59 GiB\) must be below high \('2GB': 1.86 GiB\)"),
        (0.8, 0.5, ValueError, r"low \(0.8 of the device\) must be below high \(0.5 of the device\)"),
        (100, 100, ValueError, r"low \(100 B\) must be below high \(100 B\)"),
        (1.5, 2.0, ValueError, r"low as a fraction of the device's total must be in \[0, 1\] \(got 1.5\)"),
        (-1, 10, ValueError, r"WatermarkStrategy low must be >= 0 bytes \(got -1\)"),
        ("2 apples", 10, ValueError, r"WatermarkStrategy low must be a number followed by a unit"),
        (True, 10, TypeError, r"low must be bytes \(an int\), .* \(got True that is a <class 'bool'>\)"),
        (1, [2], TypeError, r"high must be bytes .* \(got \[2\] that is a <class 'list'>\)"),
    ],
)
def test_bad_watermarks_are_refused_naming_the_fault(low, high, error, message):
    """Each bad watermark raises naming which one, the rule and what was given."""
    with pytest.raises(error, match=message):
        WatermarkStrategy(low, high)


def test_watermarks_that_do_not_fit_the_device_are_refused_at_enable_and_nothing_changes():
    """high above the device's total, or a fraction low above a byte high, fails at enable; offload stays off."""
    cm = ComponentsManager()
    cm.add("a", sized(200))
    with pytest.raises(ValueError, match=r"high \(2000 B\) is more than the device's total \(1000 B\)"):
        cm.enable_auto_cpu_offload(SimulatedDevice(1000), 0, offload_strategy=WatermarkStrategy(100, 2000))
    with pytest.raises(ValueError, match=r"low \(0.9 of the device: 900 B\) must be below high \(800 B\)"):
        cm.enable_auto_cpu_offload(SimulatedDevice(1000), 0, offload_strategy=WatermarkStrategy(0.9, 800))
    assert cm.offload_engine is None


def test_set_strategy_refuses_watermarks_that_do_not_fit_and_keeps_the_old_one():
    """Setting a strategy whose high passes the device leaves the engine's strategy and reserve unchanged."""
    engine, modules = engine_with(1000, {"a": 400, "b": 400}, None)
    with pytest.raises(ValueError, match=r"high \(1200 B\) is more than the device's total"):
        engine.set_strategy(WatermarkStrategy(100, 1200))
    assert type(engine.strategy).__name__ == "NextUseStrategy"
    call(modules["a"])
    call(modules["b"])
    assert not any(entry.evicted for entry in engine.log)


def test_repr_shows_the_watermarks_as_given():
    """The repr (shown in the engine's repr and the log) keeps each watermark in the form it was given."""
    assert repr(WatermarkStrategy("2GB", 0.75)) == "WatermarkStrategy(low='2GB', high=0.75)"


def test_a_model_over_high_is_refused_at_enable_naming_it_its_size_and_the_limit():
    """900 bytes fit the 1000-byte device but not under high=800, and cannot stream: enable fails before
    anything changes (the same model is accepted without the watermark)."""
    cm = ComponentsManager()
    big = sized(900)
    cm.add("big", big)
    with pytest.raises(ModelTooLargeError) as error:
        cm.enable_auto_cpu_offload(SimulatedDevice(1000), 0, offload_strategy=WatermarkStrategy(100, 800))
    text = str(error.value)
    assert (
        re.search(r"model 'big_\w+' \(900 B\) cannot fit", text) and "at most 800 B can be made free" in text
    )
    assert "WatermarkStrategy(low=100, high=800) lets use reach at most 800 B of the device's 1000 B" in text
    assert cm.offload_engine is None and not hasattr(big, "_hf_hook")
    cm.enable_auto_cpu_offload(SimulatedDevice(1000), 0)  # the device alone holds it


def test_a_model_over_high_that_streams_passes_and_runs_under_high():
    """A tower larger than high, whose groups stream within it, is accepted and runs equal, use at most high."""
    tower = Tower(depth=8)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))
    expected = tower(x)
    group = module_nbytes(tower.inp)
    high = 4 * group  # the device (9 groups) holds it whole; high does not
    engine = OffloadEngine(SimulatedDevice(9 * group), memory_reserve_margin=0)
    engine.set_strategy(WatermarkStrategy(group, high))
    engine.check_fit({"tower": tower})
    engine.attach("tower", tower)
    engine.set_plan(["tower"])
    assert torch.equal(tower(x), expected)
    assert engine.log[0].reason == "stream" and engine.probe.used_bytes() <= high
    # High below the base group and one block together: not even streaming fits; nothing attached.
    narrow = OffloadEngine(
        SimulatedDevice(9 * group), memory_reserve_margin=0, strategy=WatermarkStrategy(1, 3 * group // 2)
    )
    with pytest.raises(ModelTooLargeError) as error:
        narrow.check_fit({"other": Tower(depth=8)})
    text = str(error.value)
    assert f"model 'other' cannot fit on sim (budget {9 * group} B) even streamed group by group" in text
    assert f"lets use reach at most {3 * group // 2} B of the device's {9 * group} B" in text
    assert narrow.attached_ids() == [] and len(narrow.log) == 0


def test_set_plan_judges_a_planned_model_against_high_and_keeps_the_plan():
    """A model attached under the watermark but larger than high: set_plan refuses, nothing moved."""
    engine, modules = engine_with(1000, {"big": 900}, WatermarkStrategy(100, 800))
    with pytest.raises(
        ModelTooLargeError, match=r"set_plan: .*'big' \(900 B\).*at most 800 B of the device's"
    ):
        engine.set_plan(["big"])
    assert engine._plan.model_ids == () and len(engine.log) == 0 and used(engine) == 0


def test_set_strategy_refuses_a_limit_an_attached_model_cannot_fit_and_keeps_the_old_one():
    """Setting high below an attached model's size fails naming the model and the limit; nothing changes."""
    engine, modules = engine_with(1000, {"big": 900}, None)
    with pytest.raises(ModelTooLargeError) as error:
        engine.set_strategy(WatermarkStrategy(100, 800))
    text = str(error.value)
    assert text.startswith(
        "set_strategy(WatermarkStrategy(low=100, high=800)): model 'big' (900 B) could not fit"
    )
    assert "at most 800 B" in text and text.endswith("The strategy was not changed.")
    assert type(engine.strategy).__name__ == "NextUseStrategy"
    call(modules["big"])
    assert engine.resident_ids() == ["big"] and engine.log[-1].reason == "fits"
