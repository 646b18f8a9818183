"""Previews during an SDXL call: SDXL's own latent-to-RGB map (not SD 1.x's), results left as they were."""

from blocks.common.latent_preview import SDXL_LATENT_RGB
from blocks.stable_diffusion_xl.denoise import (
    StableDiffusionXLDenoiseStep,
    StableDiffusionXLInpaintDenoiseStep,
)

from ..helpers import (
    assert_previews_change_nothing,
    assert_previews_show_the_latents,
    make_image,
    make_mask,
)


def test_sdxl_loops_preview_with_the_sdxl_map():
    """Both SDXL loops declare SDXL's map, which differs from SD 1.x's they derive from."""
    assert StableDiffusionXLDenoiseStep.latent_rgb_map is SDXL_LATENT_RGB
    assert StableDiffusionXLInpaintDenoiseStep.latent_rgb_map is SDXL_LATENT_RGB


def test_previews_leave_text_to_image_as_it_was(sdxl_pipe):
    """Previews every step and every 2 steps leave the images as they were, one per image of the batch."""
    assert_previews_change_nothing(sdxl_pipe, prompt="a cat", num_images_per_prompt=2, batch=2)


def test_previews_leave_inpainting_as_it_was(sdxl_inpaint_pipe):
    """A 9-channel inpainting UNet's call previews its 4 latent channels and ends as it would have."""
    assert_previews_change_nothing(
        sdxl_inpaint_pipe, prompt="a cat", image=make_image(), mask_image=make_mask()
    )


def test_previews_leave_the_refiner_as_it_was(sdxl_refiner_pipe):
    """The refiner's image-to-image call with previews ends as it would have."""
    assert_previews_change_nothing(
        sdxl_refiner_pipe, steps=5, prompt="a cat", image=make_image(), strength=0.6
    )


def test_a_preview_is_the_sdxl_map_of_the_latents_after_its_step(sdxl_pipe):
    """Each preview is SDXL's latent-to-RGB map of the latents as that step left them."""
    assert_previews_show_the_latents(sdxl_pipe, SDXL_LATENT_RGB.images, num_inference_steps=3)
