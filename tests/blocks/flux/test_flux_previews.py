"""Previews during a Flux call: packed latents unpacked for FLUX.1's latent-to-RGB map, a preview decoder for
a latent space the map does not read, results left as they were."""

import re

import numpy as np
import pytest
import torch

from blocks.common.latent_preview import FLUX_LATENT_RGB
from blocks.flux.denoise import FluxDenoiseStep
from blocks.flux.utils import latent_image_ids, pack_latents, unpack_latents
from modular import BlockState

from ..helpers import (
    assert_previews_change_nothing,
    assert_previews_show_the_latents,
    forwards_of,
    tiny_preview_decoder,
)
from .conftest import FLUX, make_image

SIZE = {"height": 48, "width": 32}  # 24x16 latent cells: not square, so a swapped height and width shows

flux16_repo = FLUX.repo_fixture(
    "tiny-flux-16", "A tiny Flux repo with FLUX.1's 16 latent channels.", latent_channels=16
)
flux16_pipe = FLUX.pipe_fixture("flux16_repo")


def test_packed_latents_preview_as_the_unpacked_ones():
    """The loop unpacks packed latents [B, tokens, 64] with the size its position ids give: the preview equals
    the map's images of the latents [B, 16, 6, 10] they were packed from."""
    latents = torch.randn(2, 16, 6, 10, generator=torch.Generator().manual_seed(0))
    state = BlockState(
        latents=pack_latents(latents), latent_image_ids=latent_image_ids(3, 5, "cpu", torch.float32)
    )
    images = FluxDenoiseStep().preview_images(None, state)
    expected = FLUX_LATENT_RGB.images(latents)
    assert [image.size for image in images] == [(10, 6), (10, 6)]
    assert [np.asarray(image).tolist() for image in images] == [
        np.asarray(image).tolist() for image in expected
    ]


def test_previews_leave_text_to_image_as_it_was(flux16_pipe):
    """Previews every step and every 2 steps leave the images as they were: one 16x24 preview (the latents'
    size of a 32x48 image) per image, at the steps due."""
    assert_previews_change_nothing(
        flux16_pipe, prompt="a cat", num_images_per_prompt=2, batch=2, size=(16, 24), **SIZE
    )


def test_a_preview_is_the_flux_map_of_the_unpacked_latents(flux16_pipe):
    """Each preview is FLUX.1's map of the step's latents, unpacked to 24x16 cells."""
    assert_previews_show_the_latents(
        flux16_pipe, lambda packed: FLUX_LATENT_RGB.images(unpack_latents(packed, 24, 16)), **SIZE
    )


def test_a_map_of_another_latent_space_is_refused_before_any_model_runs(flux_pipe):
    """The tiny 4-channel VAE's latents are not FLUX.1's: previews by the map are refused before any model runs,
    naming the fix."""
    message = (
        "previews: the FLUX.1 latent-to-RGB map takes latents [batch, 16, height, width], but this pipeline's VAE "
        "makes latents of 4 channels; pass preview_decoder="
    )
    models = (flux_pipe.text_encoder, flux_pipe.text_encoder_2, flux_pipe.transformer)
    with forwards_of(*models) as forwards, pytest.raises(ValueError, match=re.escape(message)):
        flux_pipe(prompt="a cat", num_inference_steps=2, on_preview=print, **SIZE)
    assert forwards == []


def test_a_preview_decoder_previews_any_latent_space(flux_pipe):
    """A 4-channel preview decoder previews the tiny repo's latents, unpacked, and changes nothing."""
    previews = assert_previews_change_nothing(
        flux_pipe, decoder=tiny_preview_decoder(latent_channels=4), prompt="a cat", **SIZE
    )
    assert [image.size for image in previews[0].images] == [(32, 48)]


def test_previews_leave_image_to_image_as_it_was(flux16_pipe):
    """An image-to-image call with previews ends as it would have."""
    assert_previews_change_nothing(flux16_pipe, steps=5, prompt="a cat", image=make_image(), **SIZE)


def test_previews_leave_control_as_it_was(flux_control_pipe):
    """A control call (control latents beside the latents) previews by a decoder and ends as it would have."""
    assert_previews_change_nothing(
        flux_control_pipe,
        decoder=tiny_preview_decoder(latent_channels=4),
        prompt="a cat",
        control_image=make_image(1),
        **SIZE,
    )
