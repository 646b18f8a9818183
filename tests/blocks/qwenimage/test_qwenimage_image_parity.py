"""Our Qwen-Image image-to-image and inpainting equal QwenImageImg2ImgPipeline and QwenImageInpaintPipeline bit
for bit on CPU float32."""

import torch

from .. import helpers
from ..helpers import STEPS, assert_identical, over_cases, seeded
from .conftest import SIZE, make_image, make_mask, run_both

SIZE_INPUTS = {"height": SIZE, "width": SIZE}

IMAGE2IMAGE_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 3},
    "strength_and_negative": {
        "prompt": "a cat",
        "negative_prompt": "blurry",
        "strength": 0.5,
        "num_inference_steps": 4,
    },
    "two_per_prompt": {
        "prompt": "a cat",
        "negative_prompt": "blurry",
        "num_images_per_prompt": 2,
        "strength": 1.0,
    },
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"], "strength": 0.9},
    "no_guidance": {"prompt": "a cat", "negative_prompt": "blurry", "true_cfg_scale": 1.0, "strength": 0.9},
}


@over_cases(IMAGE2IMAGE_CASES)
def test_image2image_parity(qwen_pipe, case, output_type):
    """Image-to-image equals QwenImageImg2ImgPipeline, including the default strength (0.6)."""
    kwargs = {"num_inference_steps": STEPS, **SIZE_INPUTS, **IMAGE2IMAGE_CASES[case]}
    assert_identical(
        *run_both(qwen_pipe, "image2image", image=make_image(), output_type=output_type, **kwargs)
    )


def test_image2image_resizes_latents_and_generator_list(qwen_pipe):
    """A 48 x 32 image resized to the default-free 32 x 48 request, given packed latents, and one generator per
    image (each image's VAE sample drawn with its own) give the classic results."""
    wide = make_image(size=48, height=32)
    kwargs = {"prompt": "a cat", "image": wide, "num_inference_steps": 3, "output_type": "np"}
    assert_identical(*run_both(qwen_pipe, "image2image", height=32, width=48, **kwargs), shape=(1, 32, 48, 3))
    latents = torch.randn(1, 4, 16, generator=seeded(5))
    assert_identical(*run_both(qwen_pipe, "image2image", latents=latents, **SIZE_INPUTS, **kwargs))
    images = {"image": [make_image(1), make_image(2)], "prompt": ["a cat", "a dog"], "output_type": "latent"}
    assert_identical(
        *run_both(qwen_pipe, "image2image", seed=(1, 2), num_inference_steps=3, **SIZE_INPUTS, **images)
    )


INPAINTING_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 3},
    "strength_and_negative": {
        "prompt": "a cat",
        "negative_prompt": "blurry",
        "strength": 0.5,
        "num_inference_steps": 4,
    },
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2, "strength": 1.0},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"], "strength": 0.9},
}


@over_cases(INPAINTING_CASES)
def test_inpainting_parity(qwen_pipe, case, output_type):
    """Inpainting equals QwenImageInpaintPipeline: the image kept outside the mask at every step."""
    kwargs = {"num_inference_steps": STEPS, **SIZE_INPUTS, **INPAINTING_CASES[case]}
    inputs = {"image": make_image(), "mask_image": make_mask(), "output_type": output_type}
    assert_identical(*run_both(qwen_pipe, "inpainting", **inputs, **kwargs))


def test_inpainting_generator_list_and_pil(qwen_pipe):
    """One generator per image, and PIL output, give the classic results."""
    inputs = {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), **SIZE_INPUTS}
    kwargs = {"num_images_per_prompt": 2, "num_inference_steps": 3, "output_type": "latent"}
    assert_identical(*run_both(qwen_pipe, "inpainting", seed=(1, 2), **inputs, **kwargs))
    helpers.assert_identical_pil(*run_both(qwen_pipe, "inpainting", num_inference_steps=3, **inputs))


def test_the_mask_keeps_the_image_outside_it(qwen_pipe):
    """Inpainting's final latents are the image's latents wherever the (packed) mask is 0, and differ where it is 1."""
    inputs = {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), "num_inference_steps": 3}
    out = qwen_pipe(
        generator=seeded(0),
        output_type="latent",
        output=["images", "mask", "image_latents"],
        **inputs,
        **SIZE_INPUTS,
    )
    kept = out["mask"] == 0
    assert kept.any() and not kept.all()
    assert torch.equal(out["images"][kept], out["image_latents"][kept])
    assert not torch.equal(out["images"][~kept], out["image_latents"][~kept])
