"""Our SDXL inpainting equals diffusers' StableDiffusionXLInpaintPipeline bit for bit on CPU float32."""

import pytest
import torch

from .conftest import classic_from, make_image, make_mask
from .test_sdxl_parity import assert_identical, run_both

STEPS = 2
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


@pytest.mark.parametrize("output_type", ["latent", "np"])
@pytest.mark.parametrize("case", list(INPAINT_CASES))
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
    ours, theirs = run_both(pipe, "inpainting", image=make_image(), mask_image=make_mask(), **kwargs)
    assert_identical(ours, theirs)


def test_inpainting_given_latents_and_generator_list(sdxl_inpaint_pipe):
    """Given latents start the loop at full strength; one generator per image gives the classic result."""
    kwargs = {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), "num_images_per_prompt": 2}
    kwargs.update(num_inference_steps=STEPS, output_type="latent", **CLASSIC_GUIDANCE)
    latents = torch.randn(2, 4, 32, 32, generator=torch.Generator("cpu").manual_seed(5))
    # The masked image is still encoded (sampled), so both runs get a generator of the same seed.
    ours, theirs = run_both(sdxl_inpaint_pipe, "inpainting", latents=latents, strength=1.0, **kwargs)
    assert_identical(ours, theirs)
    generators = [torch.Generator("cpu").manual_seed(s) for s in (1, 2)]
    theirs = classic_from(sdxl_inpaint_pipe, "inpainting")(generator=generators, **kwargs).images
    generators = [torch.Generator("cpu").manual_seed(s) for s in (1, 2)]
    assert_identical(sdxl_inpaint_pipe(generator=generators, output="images", **kwargs), theirs)
