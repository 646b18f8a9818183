"""Our Z-Image blocks equal diffusers' ZImagePipeline and ZImageImg2ImgPipeline bit for bit on CPU float32."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from blocks.common import vae_scale_factor

from .. import helpers
from ..helpers import STEPS, assert_identical, over_cases, seeded
from .conftest import SIZE, make_image, run_both

TEXT2IMAGE_CASES = {
    **helpers.PROMPT_CASES,
    "no_guidance": {"prompt": ["a photo of a cat", "a red dog"], "guidance_scale": 0.0},
    "cfg_options": {"prompt": "a cat", "cfg_normalization": True, "cfg_truncation": 0.1},
    "size_and_length": {"prompt": "the astronaut", "height": 48, "width": 32, "max_sequence_length": 8},
}


@over_cases(TEXT2IMAGE_CASES)
def test_text2image_parity(zimage_pipe, case, output_type):
    """Text-to-image equals ZImagePipeline for prompts, negatives, batches, n per prompt, no CFG and CFG options."""
    kwargs = {"height": SIZE, "width": SIZE, **TEXT2IMAGE_CASES[case]}
    kwargs.update(num_inference_steps=STEPS, output_type=output_type)
    assert_identical(*run_both(zimage_pipe, "text2image", **kwargs))


def test_cfg_options_change_the_result(zimage_pipe):
    """cfg_truncation and cfg_normalization take effect (the parity case above is not a no-op)."""
    kwargs = {"prompt": "a cat", "height": SIZE, "width": SIZE, "num_inference_steps": STEPS}
    kwargs.update(output_type="latent", output="images")
    plain = zimage_pipe(generator=seeded(0), **kwargs)
    truncated = zimage_pipe(generator=seeded(0), cfg_truncation=0.1, **kwargs)
    normalized = zimage_pipe(generator=seeded(0), cfg_normalization=0.5, **kwargs)
    assert not torch.equal(plain, truncated)
    assert not torch.equal(plain, normalized)


@pytest.mark.parametrize("guidance_scale", [4.0, 0.0])
def test_text2image_precomputed_embeddings(zimage_pipe, guidance_scale):
    """Precomputed prompt_embeds and negative_prompt_embeds lists (of different lengths) give the classic result."""
    generator = seeded(3)
    prompt_embeds = [torch.randn(5, 16, generator=generator), torch.randn(9, 16, generator=generator)]
    negative_prompt_embeds = [
        torch.randn(7, 16, generator=generator),
        torch.randn(3, 16, generator=generator),
    ]
    ours, theirs = run_both(
        zimage_pipe,
        "text2image",
        prompt_embeds=prompt_embeds,
        negative_prompt_embeds=negative_prompt_embeds,
        guidance_scale=guidance_scale,
        num_images_per_prompt=2,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        output_type="latent",
    )
    assert_identical(ours, theirs)


def test_text2image_latents_sigmas_and_generator_list(zimage_pipe):
    """Given latents, custom sigmas, and a list of generators (one per image) each give the classic result."""
    base = {"prompt": "a cat", "num_images_per_prompt": 2, "height": SIZE, "width": SIZE}
    latents = torch.randn(2, 16, 16, 16, generator=seeded(5))
    cases = [
        {"latents": latents, "num_inference_steps": STEPS, "output_type": "np"},
        {"sigmas": [1.0, 0.8, 0.3], "num_inference_steps": 3, "output_type": "latent"},
    ]
    for extra in cases:
        assert_identical(*run_both(zimage_pipe, "text2image", **base, **extra))
    kwargs = {**base, "num_inference_steps": STEPS, "output_type": "latent"}
    assert_identical(*run_both(zimage_pipe, "text2image", seed=(1, 2), **kwargs))


IMAGE2IMAGE_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 3},
    "strength": {"prompt": "a photo of a cat", "strength": 0.5, "num_inference_steps": 4},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2, "strength": 1.0},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"], "strength": 0.9},
    "no_guidance": {"prompt": ["a cat", "a red dog"], "guidance_scale": 0.0, "strength": 0.9},
    "cfg_options": {"prompt": "a cat", "cfg_normalization": 1.1, "cfg_truncation": 0.1, "strength": 1.0},
}


@over_cases(IMAGE2IMAGE_CASES)
def test_image2image_parity(zimage_pipe, case, output_type):
    """Image-to-image equals ZImageImg2ImgPipeline, including the default strength (0.6)."""
    kwargs = {"num_inference_steps": STEPS, **IMAGE2IMAGE_CASES[case]}
    assert_identical(
        *run_both(zimage_pipe, "image2image", image=make_image(), output_type=output_type, **kwargs)
    )


def test_image2image_size_latents_and_generator_list(zimage_pipe):
    """A 48x32 image sets the size; given latents are used as they are; one generator per image matches."""
    wide = make_image(size=48).crop((0, 0, 48, 32))
    ours, theirs = run_both(
        zimage_pipe, "image2image", prompt="a cat", image=wide, num_inference_steps=3, output_type="np"
    )
    assert_identical(ours, theirs, shape=(1, 32, 48, 3))
    latents = torch.randn(1, 16, 8, 12, generator=seeded(5))
    ours, theirs = run_both(
        zimage_pipe, "image2image", prompt="a cat", image=wide, latents=latents, num_inference_steps=3
    )
    helpers.assert_identical_pil(ours, theirs)
    kwargs = {"prompt": "a cat", "image": make_image(), "num_images_per_prompt": 2, "num_inference_steps": 3}
    assert_identical(*run_both(zimage_pipe, "image2image", seed=(1, 2), output_type="latent", **kwargs))


def test_parity_with_dynamic_shifting(zimage_pipe):
    """With a scheduler that shifts by the image size (mu), both workflows still match the classic ones."""
    original = zimage_pipe.scheduler
    config = {**original.config, "use_dynamic_shifting": True}
    zimage_pipe.update_components(scheduler=FlowMatchEulerDiscreteScheduler.from_config(config))
    try:
        for workflow, extra in {"text2image": {}, "image2image": {"image": make_image()}}.items():
            kwargs = {"prompt": "a cat", "height": SIZE, "width": SIZE, "num_inference_steps": 3, **extra}
            assert_identical(*run_both(zimage_pipe, workflow, output_type="latent", **kwargs))
    finally:
        zimage_pipe.update_components(scheduler=original)


def test_pil_output(zimage_pipe):
    """output_type='pil' (the default) gives PIL images with the classic pipeline's pixels."""
    ours, theirs = run_both(
        zimage_pipe, "text2image", prompt="a cat", height=SIZE, width=SIZE, num_inference_steps=STEPS
    )
    helpers.assert_identical_pil(ours, theirs, size=(SIZE, SIZE))


def test_image2image_size_follows_the_vae_scale_not_16(zimage_pipe):
    """With a VAE of scale 2, a 44x36 image keeps its size (multiples of 4), as in the classic pipeline
    (an image processor fixed at 16 made 32x32)."""
    assert vae_scale_factor(zimage_pipe) == 2
    image = make_image(size=44).crop((0, 0, 44, 36))
    helpers.assert_makes_44x36_as_the_classic(run_both, zimage_pipe, "image2image", image=image)
