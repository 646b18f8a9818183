"""Our SDXL inpainting equals diffusers' StableDiffusionXLInpaintPipeline bit for bit on CPU float32."""

import pytest
import torch

from ..helpers import STEPS, assert_identical, make_image, make_mask, over_cases, seeded
from .conftest import run_both

# The classic inpainting pipeline's default guidance (ours is SDXL's 5.0 in every workflow).
CLASSIC_GUIDANCE = {"guidance_scale": 7.5}

INPAINT_CASES = {
    "default_strength": {"prompt": "a photo of a cat"},
    "strength": {"prompt": "a photo of a cat", "strength": 0.75, "num_inference_steps": 4},
    "full_strength": {"prompt": "a cat", "strength": 1.0},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"]},
    "no_guidance": {"prompt": ["a cat", "a red dog"], "guidance_scale": 1.0},
    "denoising_start": {"prompt": "a cat", "denoising_start": 0.5, "num_inference_steps": 4},
}


@over_cases(INPAINT_CASES)
@pytest.mark.parametrize("unet_channels", [9, 4])
def test_inpainting_parity(sdxl_pipe, sdxl_inpaint_pipe, unet_channels, case, output_type):
    """Inpainting equals the classic pipeline for a 9-channel and a 4-channel (pasted back) UNet."""
    pipe = sdxl_inpaint_pipe if unet_channels == 9 else sdxl_pipe
    assert pipe.unet.config.in_channels == unet_channels
    kwargs = {
        "num_inference_steps": STEPS,
        "output_type": output_type,
        **CLASSIC_GUIDANCE,
        **INPAINT_CASES[case],
    }
    assert_identical(*run_both(pipe, "inpainting", image=make_image(), mask_image=make_mask(), **kwargs))


def test_inpainting_given_latents_and_generator_list(sdxl_inpaint_pipe):
    """Given latents start the loop at full strength; one generator per image gives the classic result."""
    kwargs = {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), "num_images_per_prompt": 2}
    kwargs.update(num_inference_steps=STEPS, output_type="latent", **CLASSIC_GUIDANCE)
    latents = torch.randn(2, 4, 32, 32, generator=seeded(5))
    # The masked image is still encoded (sampled), so both runs get a generator of the same seed.
    assert_identical(*run_both(sdxl_inpaint_pipe, "inpainting", latents=latents, strength=1.0, **kwargs))
    assert_identical(*run_both(sdxl_inpaint_pipe, "inpainting", seed=(1, 2), **kwargs))
