"""Previews during a Z-Image call: FLUX.1's latent-to-RGB map (Z-Image decodes with FLUX.1's VAE) on latents
that are not packed, results left as they were."""

from blocks.common.latent_preview import FLUX_LATENT_RGB, Z_IMAGE_LATENT_RGB
from blocks.z_image.denoise import ZImageDenoiseStep

from ..helpers import assert_previews_change_nothing, assert_previews_show_the_latents
from .conftest import make_image


def test_z_image_previews_with_flux_s_latent_space():
    """Z-Image's map is FLUX.1's numbers under its own name."""
    assert ZImageDenoiseStep.latent_rgb_map is Z_IMAGE_LATENT_RGB
    assert Z_IMAGE_LATENT_RGB.factors == FLUX_LATENT_RGB.factors
    assert Z_IMAGE_LATENT_RGB.bias == FLUX_LATENT_RGB.bias


def test_previews_leave_text_to_image_as_it_was(zimage_pipe):
    """Previews every step and every 2 steps leave the images as they were: one 16x24 preview (the latents'
    size of a 32x48 image) per image, at the steps due."""
    assert_previews_change_nothing(
        zimage_pipe, prompt="a cat", num_images_per_prompt=2, batch=2, size=(16, 24), height=48, width=32
    )


def test_previews_leave_image_to_image_as_it_was(zimage_pipe):
    """An image-to-image call with previews ends as it would have."""
    assert_previews_change_nothing(zimage_pipe, steps=5, prompt="a cat", image=make_image(), strength=0.6)


def test_a_preview_is_the_map_of_the_latents_after_its_step(zimage_pipe):
    """Each preview is the map of the latents [B, 16, H, W] as that step left them."""
    assert_previews_show_the_latents(zimage_pipe, Z_IMAGE_LATENT_RGB.images, height=32, width=32)
