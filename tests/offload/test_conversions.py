"""A hooked model's own .to(): a device move by hand is refused, a dtype conversion goes through the engine."""

import pytest
import torch

from offload import DeviceMoveError, OffloadEngine, SimulatedDevice, module_nbytes
from tests.offload.helpers import MetaProbe, call, sized, tiny_vae


def _engine_with(module, probe=None):
    engine = OffloadEngine(probe or MetaProbe(10**9), memory_reserve_margin=0)
    engine.attach("m", module)
    return engine


def test_a_device_move_by_hand_is_refused_and_nothing_moves():
    """module.to("meta") of an evicted hooked model raises DeviceMoveError naming it and the fix; its weights
    stay on the host copy and its output is unchanged."""
    module = sized(64)
    expected = call(module)
    engine = _engine_with(module, SimulatedDevice("1GB"))
    with pytest.raises(
        DeviceMoveError,
        match=r"auto offload places \['m'\] on its own .* moving them to meta by hand would bypass it.*"
        r"disable_auto_cpu_offload\(\)",
    ):
        module.to("meta")
    assert module.weight.device.type == "cpu"
    assert torch.equal(call(module), expected)
    assert engine.nbytes("m") == module_nbytes(module)


def test_a_resident_model_moved_to_the_host_by_hand_is_refused():
    """A resident model (on the engine's device) given .to("cpu") is refused; it stays resident there."""
    module = sized(64)
    engine = _engine_with(module)
    engine.ensure_resident("m")
    assert module.weight.device.type == "meta"
    with pytest.raises(DeviceMoveError, match=r"\['m'\].*moving them to cpu by hand"):
        module.to("cpu")
    assert module.weight.device.type == "meta" and engine.is_resident("m")


def test_a_move_to_where_every_tensor_is_moves_nothing_and_is_allowed():
    """An evicted model given .to("cpu"), or the libraries' .to(device=self.device, dtype=self.dtype), returns
    the module with nothing moved or logged."""
    module = sized(64)
    engine = _engine_with(module)
    before = len(engine.log)
    assert module.to("cpu") is module
    assert module.to(device=module.weight.device, dtype=module.weight.dtype) is module
    assert module.weight.device.type == "cpu" and len(engine.log) == before


def test_a_dtype_conversion_of_a_resident_model_converts_its_host_copy():
    """.to(torch.float64) of a model resident on the device converts the host copy itself: after eviction the
    weights are float64 with the old values, and the engine counts the new size."""
    module = sized(64)
    original = module.weight.detach().clone()
    engine = _engine_with(module)
    engine.ensure_resident("m")
    assert module.to(torch.float64) is module
    assert engine.nbytes("m") == 128
    engine.ensure_resident("m")
    assert module.weight.dtype == torch.float64
    engine.evict("m")
    assert module.weight.device.type == "cpu" and module.weight.dtype == torch.float64
    assert torch.equal(module.weight, original.double())
    assert engine.log.total_bytes_to_host == 0


def test_an_upcast_and_back_under_offload_leaves_the_weights_bit_equal():
    """A float16 VAE upcast for decoding and cast back (what SD/SDXL decoding does for force_upcast) decodes
    as without offload; then its weights and its counted size are the float16 ones again."""
    vae = tiny_vae().to(torch.float16)
    plain = tiny_vae().to(torch.float16)
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain.to(dtype=torch.float32)
        expected = plain.decode(latents).sample
        plain.to(dtype=torch.float16)
    engine = _engine_with(vae, SimulatedDevice("1GB"))
    half_bytes = engine.nbytes("m")
    with torch.no_grad():
        vae.to(dtype=torch.float32)
        assert engine.nbytes("m") == 2 * half_bytes
        decoded = vae.decode(latents).sample
        vae.to(dtype=torch.float16)
    assert torch.equal(decoded, expected)
    assert engine.nbytes("m") == half_bytes
    assert all(torch.equal(a, b) for a, b in zip(vae.state_dict().values(), plain.state_dict().values()))


def test_a_conversion_to_the_dtype_it_has_does_nothing():
    """.to(dtype) with the model's own dtype neither evicts it nor logs anything."""
    module = sized(64)
    engine = _engine_with(module)
    engine.ensure_resident("m")
    before = len(engine.log)
    module.to(torch.float32)
    assert engine.is_resident("m") and len(engine.log) == before


def test_detach_gives_the_module_its_own_to_back():
    """After detach, .to() is the module's own method again: any device is allowed."""
    module = sized(64)
    engine = _engine_with(module, SimulatedDevice("1GB"))
    engine.detach("m")
    assert "to" not in vars(module)
    assert module.to("meta").weight.device.type == "meta"
