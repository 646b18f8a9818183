"""Auto offload through the ComponentsManager, on a simulated device with models of exact sizes."""

import pytest
import torch

from components import ComponentsManager
from offload import LRUStrategy, NextUseStrategy, OffloadStrategy, SimulatedDevice
from tests.offload.helpers import call, sized


def manager_with(budget, sizes, margin=0, strategy=None):
    cm = ComponentsManager()
    models = {name: sized(n) for name, n in sizes.items()}
    ids = {name: cm.add(name, model) for name, model in models.items()}
    cm.enable_auto_cpu_offload(
        SimulatedDevice(budget), memory_reserve_margin=margin, offload_strategy=strategy
    )
    return cm, models, ids


def test_nothing_is_evicted_when_all_fits():
    """Every model used once within the budget stays resident and the log shows no eviction."""
    cm, models, ids = manager_with(1000, {"text_encoder": 200, "unet": 500, "vae": 100})
    for model in models.values():
        call(model)
    assert all(cm.offload_engine.is_resident(i) for i in ids.values())
    assert cm.offload_log.total_evictions == 0


def test_next_use_eviction_picks_the_model_needed_furthest_ahead():
    """With the plan set from objects, the model needed latest is the one evicted."""
    cm, models, ids = manager_with(300, {"a": 100, "b": 100, "c": 100, "d": 100})
    cm.set_execution_plan([models[n] for n in "abcd"] + ["a tokenizer, skipped"])
    for name in "abcd":
        call(models[name])
    assert cm.offload_log[-1].evicted == (ids["c"],)


def test_text_encoder_not_denoiser_is_evicted_when_both_cannot_fit():
    """In a second image, the loop's denoiser stays and the once-per-image text encoder is evicted."""
    cm, models, ids = manager_with(1000, {"text_encoder": 400, "controlnet": 200, "unet": 500, "vae": 100})
    plan = [models[n] for n in ("text_encoder", "controlnet", "unet", "vae")]
    for _ in range(2):
        cm.set_execution_plan(plan)
        call(models["text_encoder"])
        for _step in range(3):
            call(models["controlnet"])
            call(models["unet"])
        call(models["vae"])
    engine = cm.offload_engine
    evicted = [victim for decision in cm.offload_log for victim in decision.evicted]
    assert ids["unet"] not in evicted
    assert ids["text_encoder"] in evicted
    assert engine.is_resident(ids["unet"])


def test_the_margin_changes_the_decision():
    """The same calls evict nothing with no margin and evict with a 300-byte margin."""
    for margin, expected in ((0, 0), (300, 1)):
        cm, models, _ = manager_with(1000, {"a": 400, "b": 400}, margin=margin)
        call(models["a"])
        call(models["b"])
        assert cm.offload_log.total_evictions == expected
        assert cm.offload_engine.memory_reserve_margin == margin


def test_disabling_restores_everything():
    """After disable, every model is on the CPU with its own forward and no hook; outputs are unchanged."""
    cm, models, ids = manager_with(1000, {"a": 400, "b": 400})
    expected = {name: call(model) for name, model in models.items()}
    cm.disable_auto_cpu_offload()
    assert cm.offload_engine is None and cm.offload_log is None
    for name, model in models.items():
        assert not hasattr(model, "_hf_hook")
        assert model.weight.device.type == "cpu"
        assert torch.equal(call(model), expected[name])
        assert cm.get_model_info(ids[name], "has_hook") == {"has_hook": False}


def test_components_added_and_removed_while_on_touch_nothing_else():
    """Adding and removing models under offload keeps the strategy, margin, residents and other hooks."""
    strategy = LRUStrategy()
    cm, models, ids = manager_with(1000, {"a": 400}, margin=100, strategy=strategy)
    call(models["a"])
    hook_a = models["a"]._hf_hook
    new = sized(200)
    new_id = cm.add("b", new)
    engine = cm.offload_engine
    assert engine.has_hook(new_id) and not engine.is_resident(new_id)
    call(new)
    cm.remove(new_id)
    assert not hasattr(new, "_hf_hook")
    assert engine is cm.offload_engine
    assert engine.strategy is strategy and engine.memory_reserve_margin == 100
    assert models["a"]._hf_hook is hook_a and engine.is_resident(ids["a"])


def test_two_pipelines_share_one_manager():
    """Two plans over shared encoders and VAE: each run places its own denoiser, sharing the rest."""
    cm, models, ids = manager_with(800, {"te": 100, "unet_a": 400, "unet_b": 400, "vae": 100})
    runs = {"A": ["te", "unet_a", "vae"], "B": ["te", "unet_b", "vae"]}
    for name in "ABAB":
        cm.set_execution_plan([models[n] for n in runs[name]])
        for model in runs[name]:
            call(models[model])
    engine = cm.offload_engine
    assert (
        engine.is_resident(ids["te"]) and engine.is_resident(ids["vae"]) and engine.is_resident(ids["unet_b"])
    )
    assert not engine.is_resident(ids["unet_a"])
    assert {v for d in cm.offload_log for v in d.evicted} == {ids["unet_a"], ids["unet_b"]}
    assert cm.offload_log.total_bytes_to_host == 0


class _EvictAll(OffloadStrategy):
    def select_victims(self, request):
        return list(request.residents)


def test_a_custom_strategy_is_kept_until_replaced():
    """A strategy set on the manager decides every eviction, survives adds and removes, until replaced."""
    cm, models, ids = manager_with(1000, {"a": 300, "b": 300, "c": 500})
    cm.set_offload_strategy(_EvictAll())
    cm.remove(cm.add("extra", sized(40)))
    for name in "abc":
        call(models[name])
    assert cm.offload_log[-1].evicted == (ids["a"], ids["b"])
    assert cm.offload_log[-1].reason == "evict: _EvictAll"
    cm.set_offload_strategy(NextUseStrategy())
    assert isinstance(cm.offload_engine.strategy, NextUseStrategy)


def test_table_shows_device_cells():
    """The printed manager shows 'cpu(sim)' for a model off the device and 'sim(sim)' for a resident one."""
    cm, models, ids = manager_with(1000, {"a": 400, "b": 400})
    call(models["a"])
    rows = {line.split(" | ")[0].strip(): line for line in cm.table().splitlines() if " | " in line}
    assert "sim(sim)" in rows[ids["a"]]
    assert "cpu(sim)" in rows[ids["b"]]


def test_a_model_too_large_fails_clearly_through_the_manager():
    """Calling a model added under offload that is bigger than the budget raises, naming its manager id."""
    from offload import ModelTooLargeError

    cm, _, _ = manager_with(100, {})
    big = sized(400)
    big_id = cm.add("big", big)
    with pytest.raises(ModelTooLargeError, match=f"model '{big_id}' needs 400 B"):
        call(big)


def test_enable_refuses_models_that_cannot_fit_alone_and_changes_nothing():
    """enable_auto_cpu_offload lists every model bigger than capacity minus margin; offload stays as it was."""
    from offload import ModelTooLargeError

    cm = ComponentsManager()
    models = {name: sized(n) for name, n in {"small": 400, "big": 1200, "huge": 5000}.items()}
    ids = {name: cm.add(name, model) for name, model in models.items()}
    with pytest.raises(ModelTooLargeError) as info:
        cm.enable_auto_cpu_offload(SimulatedDevice(1000), memory_reserve_margin=200)
    assert str(info.value) == (
        f"models '{ids['big']}' (1200 B) and '{ids['huge']}' (5000 B) cannot fit on sim (budget 1000 B) even "
        "alone: at most 800 B can be made free for one model (memory_reserve_margin 200 B). Use a larger "
        "device, a smaller memory_reserve_margin, or load the models in a smaller dtype or quantized. Auto "
        "offload was left off."
    )
    assert not cm.auto_offload_enabled
    assert all(not hasattr(model, "_hf_hook") for model in models.values())
    cm.enable_auto_cpu_offload(SimulatedDevice(10_000), memory_reserve_margin=0)
    engine = cm.offload_engine
    with pytest.raises(ModelTooLargeError, match=r"Auto offload was left on with the previous settings\.$"):
        cm.enable_auto_cpu_offload(SimulatedDevice(1000), memory_reserve_margin=0)
    assert cm.offload_engine is engine and engine.has_hook(ids["huge"])
