"""The engine on a simulated device: placement, errors, strategies, margin, log, out-of-memory retry."""

import pytest
import torch

from components.table import device_cell
from offload import (
    LRUStrategy,
    ModelTooLargeError,
    NextUseStrategy,
    OffloadEngine,
    OffloadOutOfMemoryError,
    OffloadStrategy,
    SimulatedDevice,
    StrategyError,
)
from tests.offload.helpers import call, sized


def engine_with(budget, sizes, margin=0, strategy=None):
    engine = OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=margin, strategy=strategy)
    modules = {name: sized(n) for name, n in sizes.items()}
    for name, module in modules.items():
        engine.attach(name, module)
    return engine, modules


def test_nothing_is_evicted_when_everything_fits():
    """Three models within the budget all stay resident; the log shows three 'fits'."""
    engine, modules = engine_with(1000, {"a": 200, "b": 300, "c": 400})
    for module in modules.values():
        call(module)
    assert engine.resident_ids() == ["a", "b", "c"]
    assert [d.reason for d in engine.log] == ["fits"] * 3
    assert all(d.evicted == () for d in engine.log)


def test_hooked_outputs_equal_the_run_without_offload():
    """Outputs through the hook are bit-identical to the plain module's, args and kwargs alike."""
    module = sized(64)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    expected = module(x)
    engine = OffloadEngine(SimulatedDevice(100), memory_reserve_margin=0)
    engine.attach("m", module)
    assert torch.equal(module(x), expected)
    assert torch.equal(module(input=x), expected)
    assert engine.is_resident("m")


def test_next_use_eviction_picks_the_model_needed_furthest_ahead():
    """With plan a, b, c, d and room for three, d's arrival evicts the one needed latest next time."""
    engine, modules = engine_with(300, {"a": 100, "b": 100, "c": 100, "d": 100})
    engine.set_plan(["a", "b", "c", "d"])
    for name in "abc":
        call(modules[name])
    call(modules["d"])
    assert engine.log[-1].evicted == ("c",)
    assert engine.resident_ids() == ["a", "b", "d"]


def test_the_margin_changes_the_decision():
    """The same request fits with no margin and evicts with a margin."""
    engine, modules = engine_with(1000, {"a": 400, "b": 400})
    call(modules["a"])
    call(modules["b"])
    assert engine.log[-1].evicted == ()
    engine, modules = engine_with(1000, {"a": 400, "b": 400}, margin=300)
    call(modules["a"])
    call(modules["b"])
    assert engine.log[-1].evicted == ("a",)
    assert engine.memory_reserve_margin == 300


def test_a_model_too_large_raises_before_anything_moves():
    """A model bigger than budget minus margin names itself, its size and the budget; residents stay."""
    engine, modules = engine_with(1000, {"a": 400, "huge": 900}, margin=200)
    call(modules["a"])
    with pytest.raises(ModelTooLargeError) as info:
        call(modules["huge"])
    assert str(info.value) == (
        "model 'huge' needs 900 B but at most 800 B can be made free on sim (budget 1000 B) with every other "
        "model evicted (memory_reserve_margin 200 B). Use a larger device, a smaller memory_reserve_margin, "
        "or load the model in a smaller dtype or quantized."
    )
    assert isinstance(info.value, ValueError)
    assert engine.resident_ids() == ["a"]
    assert len(engine.log) == 1


class _Greedy(OffloadStrategy):
    def __init__(self, answer):
        self.answer = answer

    def select_victims(self, request):
        return self.answer


def test_invalid_victims_are_rejected_before_anything_moves():
    """A strategy that names a non-resident or frees too little raises StrategyError; state is unchanged."""
    engine, modules = engine_with(500, {"a": 200, "b": 200, "c": 300})
    call(modules["a"])
    call(modules["b"])
    engine.set_strategy(_Greedy(["zzz"]))
    with pytest.raises(StrategyError, match=r"returned victims \['zzz'\] for 'c'"):
        call(modules["c"])
    engine.set_strategy(_Greedy([]))
    with pytest.raises(StrategyError, match=r"freeing 0 B, but 'c' needs 200 B more free"):
        call(modules["c"])
    assert engine.resident_ids() == ["a", "b"]


def test_a_custom_strategy_is_used_and_kept():
    """A custom strategy decides every eviction until replaced."""
    engine, modules = engine_with(200, {"a": 100, "b": 100, "c": 100}, strategy=LRUStrategy())
    call(modules["a"])
    call(modules["b"])
    call(modules["a"])
    call(modules["c"])
    assert engine.log[-1].evicted == ("b",)
    assert engine.log[-1].reason == "evict: LRUStrategy"
    engine.set_strategy(NextUseStrategy())
    assert isinstance(engine.strategy, NextUseStrategy)


def test_an_object_without_select_victims_is_not_a_strategy():
    """set_strategy rejects objects that lack select_victims, naming the shipped strategies."""
    engine = OffloadEngine(SimulatedDevice(10), memory_reserve_margin=0)
    with pytest.raises(TypeError, match="must have a select_victims"):
        engine.set_strategy(lambda hooks: hooks)


def test_attach_is_idempotent_and_rejects_conflicts():
    """Attaching the same module under the same id is a no-op; other combinations are errors."""
    engine, modules = engine_with(100, {"a": 40})
    engine.attach("a", modules["a"])
    with pytest.raises(ValueError, match="already attached to another module"):
        engine.attach("a", sized(40))
    with pytest.raises(ValueError, match="already attached as 'a'"):
        engine.attach("b", modules["a"])
    with pytest.raises(TypeError, match="needs a torch.nn.Module"):
        engine.attach("c", object())


def test_a_foreign_accelerate_hook_is_an_error_and_nothing_changes():
    """A module that already carries an accelerate hook is refused; its hook stays."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    module = sized(40)
    add_hook_to_module(module, ModelHook())
    engine = OffloadEngine(SimulatedDevice(100), memory_reserve_margin=0)
    with pytest.raises(ValueError, match="already has an accelerate hook"):
        engine.attach("m", module)
    assert type(module._hf_hook) is ModelHook
    assert not engine.has_hook("m")


def test_close_removes_every_hook_and_restores_forward():
    """After close, no module has a hook, nothing is resident, and forward is the class's own."""
    engine, modules = engine_with(1000, {"a": 100, "b": 100})
    for module in modules.values():
        call(module)
    engine.close()
    assert engine.attached_ids() == []
    for module in modules.values():
        assert not hasattr(module, "_hf_hook")
        assert module.forward.__func__ is torch.nn.Linear.forward
    assert engine.probe.used_bytes() == 0


def test_detach_unknown_id_is_a_key_error():
    """Detaching an id that is not attached lists what is."""
    engine, _ = engine_with(100, {"a": 40})
    with pytest.raises(KeyError, match=r"'zz' is not attached; attached: \['a'\]"):
        engine.detach("zz")


def test_device_cell_shows_where_now_and_where_it_runs():
    """device_cell is 'cpu(sim)' before the first call and 'sim(sim)' while resident."""
    engine, modules = engine_with(100, {"a": 40})
    assert device_cell(engine.residency("a")) == "cpu(sim)"
    call(modules["a"])
    assert device_cell(engine.residency("a")) == "sim(sim)"


def test_cpu_device_is_a_no_op_placement():
    """device='cpu' keeps every model resident on the host and logs no moves."""
    module = sized(40)
    expected = call(module)
    engine = OffloadEngine("cpu")
    engine.attach("m", module)
    assert engine.is_resident("m")
    assert torch.equal(call(module), expected)
    assert len(engine.log) == 0
    assert device_cell(engine.residency("m")) == "cpu(cpu)"


class _Flaky(torch.nn.Linear):
    """A Linear whose forward runs out of memory the first ``failures`` times."""

    def __init__(self, failures):
        super().__init__(25, 1, bias=False)
        self.failures = failures

    def forward(self, x):
        if self.failures:
            self.failures -= 1
            raise torch.OutOfMemoryError("CUDA out of memory")
        return super().forward(x)


def test_out_of_memory_in_forward_evicts_the_others_and_retries_once():
    """A forward that runs out of memory once succeeds after every other model is evicted."""
    engine, modules = engine_with(1000, {"a": 100})
    flaky = _Flaky(failures=1)
    expected = torch.nn.functional.linear(torch.ones(1, 25), flaky.weight)
    engine.attach("b", flaky)
    call(modules["a"])
    assert torch.equal(call(flaky), expected)
    assert engine.resident_ids() == ["b"]
    assert engine.log[-1].reason == "oom retry"
    assert engine.log[-1].evicted == ("a",)


def test_out_of_memory_twice_raises_with_the_details():
    """A second out-of-memory raises OffloadOutOfMemoryError naming the model, its size and free bytes."""
    engine = OffloadEngine(SimulatedDevice(1000), memory_reserve_margin=100)
    flaky = _Flaky(failures=2)
    engine.attach("b", flaky)
    with pytest.raises(OffloadOutOfMemoryError) as info:
        call(flaky)
    assert str(info.value).startswith(
        "model 'b' (100 B) ran out of memory on sim in its forward, and again after every other model was "
        "evicted (800 B free after memory_reserve_margin 100 B)."
    )
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)


def test_the_out_of_memory_error_is_also_torchs_so_peer_code_catches_it():
    """Code written for the peer catches ``torch.OutOfMemoryError`` (what its manager re-raises): ours is one
    too, as it stays a ``MemoryError``."""
    engine = OffloadEngine(SimulatedDevice(1000), memory_reserve_margin=0)
    flaky = _Flaky(failures=2)
    engine.attach("b", flaky)
    with pytest.raises(torch.OutOfMemoryError) as info:
        call(flaky)
    assert isinstance(info.value, OffloadOutOfMemoryError) and isinstance(info.value, MemoryError)


def test_without_retry_on_oom_the_first_out_of_memory_raises():
    """`retry_on_oom=False` (the peer's newest switch): the first out-of-memory raises, nothing is evicted
    for a retry and the forward ran once; the manager's switch reaches its engine."""
    from components import ComponentsManager

    engine, modules = engine_with(1000, {"a": 100})
    engine.retry_on_oom = False
    flaky = _Flaky(failures=1)
    engine.attach("b", flaky)
    call(modules["a"])
    with pytest.raises(OffloadOutOfMemoryError, match="retry_on_oom=False leaves the retry to you"):
        call(flaky)
    assert flaky.failures == 0 and "a" in engine.resident_ids()
    cm = ComponentsManager()
    cm.add("b", torch.nn.Linear(2, 2))
    cm.enable_auto_cpu_offload(SimulatedDevice(1000), memory_reserve_margin=0, retry_on_oom=False)
    assert cm.offload_engine.retry_on_oom is False


def test_refresh_host_copy_updates_the_size():
    """After weights grow in place, refresh_host_copy re-reads the size and the device's usage."""
    engine, modules = engine_with(1000, {"a": 100})
    call(modules["a"])
    modules["a"].register_buffer("extra", torch.zeros(25))
    engine.refresh_host_copy("a")
    assert engine.nbytes("a") == 200
    assert engine.probe.used_bytes() == 200
    assert engine.log[-1].reason == "refresh"


def test_the_log_prints_a_table():
    """str(log) has a header, one row per decision and the totals."""
    engine, modules = engine_with(150, {"a": 100, "b": 100})
    call(modules["a"])
    call(modules["b"])
    lines = str(engine.log).splitlines()
    cells = [[cell.strip() for cell in line.split(" | ")] for line in lines]
    assert cells[0] == [
        "#",
        "model",
        "evicted",
        "to device",
        "to host",
        "free before",
        "free after",
        "reason",
    ]
    assert cells[3][:5] == ["2", "b", "a", "100 B", "0 B"]
    assert cells[3][-1] == "evict: NextUseStrategy"
    assert (
        lines[-1] == "total: to device 200 B, to host 0 B, left the device 1 (1 whole, 0 shrunk to a prefix)"
    )
    assert engine.log.total_bytes_to_host == 0


def test_a_model_evicted_between_its_hook_and_its_forward_is_placed_again():
    """If another thread evicts a model after its hook placed it, the forward places it again first."""
    from offload import OffloadEngine, SimulatedDevice
    from tests.offload.helpers import call, sized

    engine = OffloadEngine(SimulatedDevice(1000), memory_reserve_margin=0)
    model = sized(400)
    engine.attach("m", model)
    hook = model._hf_hook
    original = hook.pre_forward

    def place_then_lose(module, *args, **kwargs):
        result = original(module, *args, **kwargs)
        engine.evict("m")  # what a concurrent call could do in this window
        return result

    hook.pre_forward = place_then_lose
    call(model)
    assert engine.is_resident("m")
    assert [d.reason for d in engine.log].count("fits") == 2


def test_sizes_in_the_too_large_message_differ_when_they_are_close():
    """'needs X but at most Y' prints X and Y with enough digits to tell them apart."""
    engine, modules = engine_with(2631000, {"big": 2632704})
    with pytest.raises(ModelTooLargeError, match=r"needs 2\.511 MiB but at most 2\.509 MiB can be made free"):
        call(modules["big"])


def test_set_plan_refuses_a_model_that_cannot_fit_alone_before_anything_moves():
    """A plan naming a model bigger than budget minus margin raises ModelTooLargeError; plan and residents stay."""
    engine, modules = engine_with(1000, {"a": 400, "big": 1200, "huge": 5000}, margin=200)
    call(modules["a"])
    engine.set_plan(["a"])
    with pytest.raises(ModelTooLargeError) as info:
        engine.set_plan(["a", "big", "huge", "big"])
    assert str(info.value) == (
        "set_plan: the call would use models 'big' (1200 B) and 'huge' (5000 B), which cannot fit on sim "
        "(budget 1000 B) even alone: at most 800 B can be made free for one model (memory_reserve_margin "
        "200 B). Use a larger device, a smaller memory_reserve_margin, or load the models in a smaller dtype "
        "or quantized. Nothing was moved."
    )
    assert engine._plan.model_ids == ("a",)
    assert engine.resident_ids() == ["a"] and len(engine.log) == 1
