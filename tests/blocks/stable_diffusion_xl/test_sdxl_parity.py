"""Our SDXL blocks equal diffusers' classic SDXL pipelines bit for bit on CPU float32."""

import copy

import pytest
import torch

from blocks.common import vae_scale_factor

from .. import helpers
from ..helpers import STEPS, assert_identical, make_image, over_cases, seeded
from .conftest import classic_from, run_both

TEXT2IMAGE_CASES = {
    **helpers.PROMPT_CASES,
    "second_prompts": {
        "prompt": "a cat",
        "prompt_2": "a red dog",
        "negative_prompt": "blurry",
        "negative_prompt_2": "blue",
    },
    **helpers.UNET_TEXT2IMAGE_CASES,
    "micro_conditioning": {
        "prompt": ["a cat", "a dog"],
        "original_size": (128, 96),
        "crops_coords_top_left": (8, 4),
        "target_size": (64, 48),
        "negative_original_size": (32, 32),
        "negative_target_size": (48, 48),
        "negative_crops_coords_top_left": (2, 2),
        "num_images_per_prompt": 2,
    },
    "clip_skip": {"prompt": "a cat", "clip_skip": 1},
    "denoising_end": {"prompt": "a cat", "denoising_end": 0.6, "num_inference_steps": 4},
}


@over_cases(TEXT2IMAGE_CASES)
def test_text2image_parity(sdxl_pipe, case, output_type):
    """Text-to-image equals StableDiffusionXLPipeline: prompts, second prompts, batches, sizes, time ids."""
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **TEXT2IMAGE_CASES[case]}
    assert_identical(*run_both(sdxl_pipe, "text2image", **kwargs))


@pytest.mark.parametrize("guidance_scale", [5.0, 1.0])
def test_text2image_precomputed_embeddings(sdxl_pipe, guidance_scale):
    """Precomputed prompt, pooled and negative embeddings give what the classic pipeline gives for them."""
    embeds = helpers.random_tensors(
        3,
        prompt_embeds=(2, 77, 64),
        negative_prompt_embeds=(2, 77, 64),
        pooled_prompt_embeds=(2, 32),
        negative_pooled_prompt_embeds=(2, 32),
    )
    kwargs = {"guidance_scale": guidance_scale, "num_images_per_prompt": 2, "num_inference_steps": STEPS}
    assert_identical(*run_both(sdxl_pipe, "text2image", output_type="latent", **embeds, **kwargs))


def test_encoded_negative_prompt_without_force_zeros(sdxl_pipe):
    """With force_zeros_for_empty_prompt off, the empty negative prompt is encoded, as in the classic."""
    sdxl_pipe.update_components(force_zeros_for_empty_prompt=False)
    try:
        ours, theirs = run_both(
            sdxl_pipe,
            "text2image",
            classic_config={"force_zeros_for_empty_prompt": False},
            prompt="a cat",
            num_inference_steps=STEPS,
            output_type="latent",
        )
        zeros = sdxl_pipe(prompt="a cat", num_inference_steps=STEPS, output_type="latent", output="images")
    finally:
        sdxl_pipe.update_components(force_zeros_for_empty_prompt=True)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, zeros)


def test_text2image_given_latents_and_generator_list(sdxl_pipe):
    """Given latents start the loop; a list of generators (one per image) gives the classic result."""
    helpers.assert_latents_and_generator_list(run_both, sdxl_pipe, (2, 4, 32, 32))


IMAGE2IMAGE_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 7},
    "strength": {"prompt": "a photo of a cat", "strength": 0.6, "num_inference_steps": 4},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2, "strength": 1.0},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "negative_prompt": ["blurry", "blue"], "strength": 1.0},
    "no_guidance": {"prompt": ["a cat", "a red dog"], "guidance_scale": 1.0, "strength": 1.0},
    "micro_conditioning": {
        "prompt": "a cat",
        "strength": 1.0,
        "original_size": (128, 96),
        "crops_coords_top_left": (8, 4),
        "negative_original_size": (32, 32),
        "negative_target_size": (48, 48),
    },
    "denoising_start": {"prompt": "a cat", "denoising_start": 0.5, "num_inference_steps": 4},
}


@over_cases(IMAGE2IMAGE_CASES)
def test_image2image_parity(sdxl_pipe, case, output_type):
    """Image-to-image equals StableDiffusionXLImg2ImgPipeline, including the default strength (0.3)."""
    kwargs = {"num_inference_steps": STEPS, "output_type": output_type, **IMAGE2IMAGE_CASES[case]}
    assert_identical(*run_both(sdxl_pipe, "image2image", image=make_image(), **kwargs))


def test_image2image_generator_list_and_latents(sdxl_pipe):
    """One generator per image encodes each repeated image with its own; given latents skip the encoding."""
    kwargs = {"prompt": "a cat", "image": make_image(), "num_images_per_prompt": 2, "strength": 0.7}
    kwargs.update(num_inference_steps=3, output_type="latent")
    assert_identical(*run_both(sdxl_pipe, "image2image", seed=(1, 2), **kwargs))
    latents = torch.randn(2, 4, 32, 32, generator=seeded(5))
    assert_identical(*run_both(sdxl_pipe, "image2image", latents=latents, **kwargs))


def test_refiner_parity(sdxl_refiner_pipe):
    """The refiner blocks on a text_encoder_2-only repo equal the classic img2img with aesthetic scores."""
    config = {"requires_aesthetics_score": True, "force_zeros_for_empty_prompt": False}
    assert sdxl_refiner_pipe.requires_aesthetics_score is True
    for extra in ({}, {"aesthetic_score": 7.5, "negative_aesthetic_score": 1.0, "negative_prompt": "blurry"}):
        ours, theirs = run_both(
            sdxl_refiner_pipe,
            "image2image",
            classic_config=config,
            prompt=["a cat", "a dog"],
            image=make_image(),
            strength=0.5,
            num_inference_steps=4,
            output_type="np",
            **extra,
        )
        assert_identical(ours, theirs)


def test_base_then_refiner_ensemble(sdxl_pipe, sdxl_refiner_pipe):
    """Base to denoising_end=0.5 as latents, then the refiner from denoising_start=0.5, equals the classic chain."""
    config = {"requires_aesthetics_score": True, "force_zeros_for_empty_prompt": False}
    base = {"prompt": "a cat", "num_inference_steps": 4, "output_type": "latent"}
    ours, theirs = run_both(sdxl_pipe, "text2image", denoising_end=0.5, **base)
    assert_identical(ours, theirs)
    refined, classic_refined = run_both(
        sdxl_refiner_pipe,
        "image2image",
        classic_config=config,
        image=ours,
        denoising_start=0.5,
        **{**base, "output_type": "np"},
    )
    assert_identical(refined, classic_refined)


def test_pil_output(sdxl_pipe):
    """output_type='pil' (the default) gives PIL images with the classic pipeline's pixels."""
    ours, theirs = run_both(sdxl_pipe, "text2image", prompt="a cat", num_inference_steps=STEPS)
    helpers.assert_identical_pil(ours, theirs, size=(64, 64))


@pytest.mark.parametrize("workflow", ["text2image", "image2image"])
def test_float16_vae_is_upcast_like_the_classic(sdxl_pipe, workflow):
    """A float16 VAE with force_upcast encodes and decodes in float32 as the classic does, and stays float16."""
    original = sdxl_pipe.vae
    half = copy.deepcopy(original).to(torch.float16)
    assert half.config.force_upcast
    extra = {"image": make_image(), "strength": 1.0} if workflow == "image2image" else {}
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "np", **extra}
    sdxl_pipe.update_components(vae=half)
    try:
        ours = sdxl_pipe(generator=seeded(0), output="images", **kwargs)
        assert sdxl_pipe.vae.dtype == torch.float16
        theirs = classic_from(sdxl_pipe, workflow)(generator=seeded(0), **kwargs).images
    finally:
        sdxl_pipe.update_components(vae=original)
    assert_identical(ours, theirs)


def test_image2image_size_follows_the_vae_scale_not_8(sdxl_pipe):
    """With a VAE of scale 2, a 44x36 image keeps its size in image-to-image, as in the classic pipeline
    (an image processor fixed at 8 made 40x32)."""
    assert vae_scale_factor(sdxl_pipe) == 2
    image = make_image(size=44).crop((0, 0, 44, 36))
    helpers.assert_makes_44x36_as_the_classic(run_both, sdxl_pipe, "image2image", steps=4, image=image)
