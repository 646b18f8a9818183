"""Previews during an SD3 call: SD3's latent-to-RGB map on its 16-channel latents, results left as they were."""

from blocks.common.latent_preview import SD3_LATENT_RGB
from blocks.sd3.denoise import SD3DenoiseStep, SD3InpaintDenoiseStep

from ..helpers import assert_previews_change_nothing, assert_previews_show_the_latents
from .conftest import make_image, make_mask


def test_both_loops_preview_with_sd3_s_latent_space():
    """The text-to-image and inpainting loops preview with SD3's map, of 16 channels."""
    assert SD3DenoiseStep.latent_rgb_map is SD3InpaintDenoiseStep.latent_rgb_map is SD3_LATENT_RGB
    assert SD3_LATENT_RGB.channels == 16


def test_previews_leave_text_to_image_as_it_was(sd3_pipe):
    """Previews every step and every 2 steps leave the images as they were: one 16x24 preview (the latents'
    size of a 32x48 image) per image, at the steps due."""
    assert_previews_change_nothing(
        sd3_pipe, prompt="a cat", num_images_per_prompt=2, batch=2, size=(16, 24), height=48, width=32
    )


def test_previews_leave_inpainting_as_it_was(sd3_inpaint_pipe):
    """An inpainting call (33-channel transformer) with previews ends as it would have."""
    inputs = {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), "strength": 0.9}
    assert_previews_change_nothing(sd3_inpaint_pipe, steps=4, **inputs)


def test_a_preview_is_the_map_of_the_latents_after_its_step(sd3_pipe):
    """Each preview is the map of the latents [B, 16, H, W] as that step left them."""
    assert_previews_show_the_latents(sd3_pipe, SD3_LATENT_RGB.images)
