"""The hook: direct calls and diffusers' VAE encode/decode both make the model resident."""

import inspect

import torch
from diffusers import AutoencoderKL

from offload import OffloadEngine, SimulatedDevice


def tiny_vae() -> AutoencoderKL:
    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(8,),
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        latent_channels=4,
        norm_num_groups=8,
        layers_per_block=1,
        sample_size=16,
    ).eval()


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
