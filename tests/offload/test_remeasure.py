"""Weights that change under offload (a LoRA added, a submodule swapped) are measured again, host copy included."""

import copy
import gc

import torch
from peft import LoraConfig, inject_adapter_in_model

import offload.weights.changes
import offload.weights.ledger
from offload import OffloadEngine, SimulatedDevice, module_nbytes
from tests.offload.helpers import MetaProbe, call, sized, tiny_vae

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def test_a_lora_added_with_add_adapter_is_measured_again_and_counted_against_the_budget():
    """After vae.add_adapter under offload, the engine's size and the device's usage are the real bytes."""
    vae, other = tiny_vae(), sized(4000)
    image = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    engine = OffloadEngine(SimulatedDevice(module_nbytes(vae) + 4000 + 512), memory_reserve_margin=0)
    engine.attach("vae", vae)
    engine.attach("other", other)
    call(other)
    with torch.no_grad():
        vae.encode(image)
    assert engine.resident_ids() == ["vae", "other"]
    vae.add_adapter(LoraConfig(r=4, target_modules=LORA_TARGETS, init_lora_weights=False))
    with torch.no_grad():
        vae.encode(image)
    assert engine.nbytes("vae") == module_nbytes(vae) > module_nbytes(tiny_vae())
    assert engine.probe.used_bytes() == module_nbytes(vae)
    assert [d.reason for d in engine.log][-2:] == ["remeasure", "evict: NextUseStrategy"]
    assert engine.log[-1].evicted == ("other",)


def test_the_host_copy_covers_lora_weights_and_outputs_survive_eviction():
    """With real moves, a LoRA injected under offload goes to the device and back; outputs equal no offload."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    plain = copy.deepcopy(model)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    config = LoraConfig(r=2, target_modules=["0", "2"], init_lora_weights=False)
    torch.manual_seed(1)
    inject_adapter_in_model(config, plain)
    expected = plain(x)
    engine = OffloadEngine(MetaProbe(budget=10**6), memory_reserve_margin=0)
    engine.attach("m", model)
    engine.ensure_resident("m")
    engine.evict("m")
    torch.manual_seed(1)
    inject_adapter_in_model(config, model)
    engine.ensure_resident("m")
    assert all(p.device.type == "meta" for p in model.parameters())
    assert engine.nbytes("m") == module_nbytes(model) == engine.probe.used["m"]
    engine.evict("m")
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert torch.equal(model._old_forward(x), expected)
    assert engine.log.total_bytes_to_host == 0


def test_a_swapped_submodule_is_measured_again():
    """Replacing a submodule with a bigger one changes the engine's size at the next call, no refresh needed."""
    model = torch.nn.Sequential(sized(400))
    engine = OffloadEngine(SimulatedDevice(10_000), memory_reserve_margin=0)
    engine.attach("m", model)
    model(torch.ones(1, 100))
    model[0] = sized(800)
    model(torch.ones(1, 200))
    assert engine.nbytes("m") == 800 and engine.probe.used_bytes() == 800


def test_the_model_is_walked_only_after_a_registration_into_an_attached_model(monkeypatch):
    """The change check is one integer comparison; only a registration into an attached model costs a walk."""
    walks = []
    fingerprint = offload.weights.ledger.module_fingerprint
    monkeypatch.setattr(
        offload.weights.ledger, "module_fingerprint", lambda *args: walks.append(1) or fingerprint(*args)
    )
    module = sized(400)
    engine = OffloadEngine(SimulatedDevice(1000), memory_reserve_margin=0)
    engine.attach("m", module)
    walks.clear()
    for _ in range(5):
        call(module)
    assert walks == []
    torch.nn.Sequential(module)  # registrations into modules no engine watches: no walk
    call(module)
    assert walks == []
    module.register_buffer("nothing", None)  # a registration into the model that changes no weight
    call(module)
    call(module)
    assert walks == [1]
    assert [d.reason for d in engine.log] == ["fits"]


def test_a_model_dropped_with_its_engine_is_no_longer_watched():
    """A model whose engine was dropped without detaching leaves no watch behind (its id may be reused)."""
    gc.collect()
    before = offload.weights.changes.watched_count()
    dropped = OffloadEngine(SimulatedDevice(1000), memory_reserve_margin=0)
    dropped.attach("old", torch.nn.Sequential(sized(400), sized(400)))
    assert offload.weights.changes.watched_count() == before + 3
    del dropped
    gc.collect()
    assert offload.weights.changes.watched_count() == before
