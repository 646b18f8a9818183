"""Previews during a Flux.2 call: by a preview decoder (no published latent-to-RGB map for FLUX.2's VAE), on the
VAE's latents (unpacked by their position ids, denormalized, unpatchified), results left as they were."""

import re

import pytest

from blocks.flux2.denoise import Flux2DenoiseStep

from ..helpers import assert_previews_change_nothing, forwards_of, run_with_previews, tiny_preview_decoder
from .conftest import SIZE, make_image


def test_flux2_has_no_latent_rgb_map_and_asks_for_a_decoder(flux2_pipe):
    """Without a map, previews need preview_decoder=: refused before any model runs."""
    assert Flux2DenoiseStep.latent_rgb_map is None
    models = (flux2_pipe.text_encoder, flux2_pipe.transformer, flux2_pipe.vae)
    with forwards_of(*models) as forwards, pytest.raises(ValueError, match=re.escape("preview_decoder")):
        flux2_pipe(prompt="a cat", height=SIZE, width=SIZE, num_inference_steps=2, on_preview=print)
    assert forwards == []


def test_a_preview_decoder_previews_both_workflows_and_changes_nothing(flux2_pipe):
    """A 4-channel preview decoder previews text-to-image (32x48: twice the 16x24 latents) and editing, and the
    images are as they would have been."""
    decoder = tiny_preview_decoder(latent_channels=4)
    previews = assert_previews_change_nothing(
        flux2_pipe, decoder=decoder, prompt="a cat", height=48, width=32
    )
    assert [image.size for image in previews[0].images] == [(32, 48)]
    assert_previews_change_nothing(flux2_pipe, decoder=decoder, prompt="a cat", image=make_image())


def test_the_decoder_sees_the_vaes_latents(flux2_pipe):
    """The decoder reads the latents as the VAE decodes them, [B, 4, H, W], never the reference images' tokens."""
    seen = []
    decoder = tiny_preview_decoder(latent_channels=4)
    original = decoder.decode

    def decode(latents, *args, **kwargs):
        seen.append(tuple(latents.shape))
        return original(latents, *args, **kwargs)

    decoder.decode = decode
    inputs = {
        "prompt": "a cat",
        "image": make_image(),
        "height": SIZE,
        "width": SIZE,
        "num_inference_steps": 2,
    }
    run_with_previews(flux2_pipe, 1, decoder, **inputs)
    assert seen == [(1, 4, 16, 16)] * 2  # one preview per step, of the 32x32 image's 16x16 VAE latents
