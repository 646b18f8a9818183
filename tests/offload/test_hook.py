"""The hook: direct calls and diffusers' VAE encode/decode both make the model resident."""

import inspect

import torch

from offload import OffloadEngine, SimulatedDevice
from tests.offload.helpers import tiny_vae


def test_vae_encode_and_decode_trigger_the_hook():
    """encode() and decode() each make the VAE resident (diffusers' apply_forward_hook calls pre_forward)."""
    vae = tiny_vae()
    image = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        latents = vae.encode(image).latent_dist.mean
        decoded = vae.decode(latents).sample
    engine = OffloadEngine(SimulatedDevice("1GB"), memory_reserve_margin=0)
    engine.attach("vae", vae)
    with torch.no_grad():
        hooked_latents = vae.encode(image).latent_dist.mean
        assert engine.is_resident("vae")
        engine.evict("vae")
        hooked_decoded = vae.decode(latents).sample
    assert engine.is_resident("vae")
    assert torch.equal(hooked_latents, latents) and torch.equal(hooked_decoded, decoded)
    assert [d.reason for d in engine.log] == ["fits", "evict", "fits"]


def test_hooked_forward_keeps_the_signature():
    """The wrapped forward shows the module's own signature."""
    module = torch.nn.Linear(2, 2)
    before = inspect.signature(module.forward)
    OffloadEngine(SimulatedDevice(100), memory_reserve_margin=0).attach("m", module)
    assert inspect.signature(module.forward) == before


def test_detach_restores_the_original_forward_after_use():
    """After a call and detach, forward is the module's own bound method and no hook attribute remains."""
    module = torch.nn.Linear(2, 2)
    engine = OffloadEngine(SimulatedDevice(100), memory_reserve_margin=0)
    engine.attach("m", module)
    module(torch.ones(1, 2))
    engine.detach("m")
    assert module.forward.__func__ is torch.nn.Linear.forward
    assert not hasattr(module, "_hf_hook") and not hasattr(module, "_old_forward")


def test_vae_decode_counts_as_running_for_its_whole_call():
    """While diffusers' decode() runs (not through forward), the VAE is running: no other thread evicts it."""
    vae = tiny_vae()
    engine = OffloadEngine(SimulatedDevice("1GB"), memory_reserve_margin=0)
    engine.attach("vae", vae)
    seen = []
    decoder_forward = vae.decoder.forward

    def watching(*args, **kwargs):
        seen.append(engine.running_ids())
        return decoder_forward(*args, **kwargs)

    vae.decoder.forward = watching
    with torch.no_grad():
        vae.decode(torch.zeros(1, 4, 16, 16))
    assert seen == [["vae"]]
    assert engine.running_ids() == []
    engine.detach("vae")
    assert "decode" not in vae.__dict__ and "encode" not in vae.__dict__
