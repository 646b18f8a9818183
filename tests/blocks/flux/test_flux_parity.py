"""Our Flux blocks equal diffusers' classic Flux pipelines bit for bit on CPU float32."""

import pytest
import torch

from blocks.common import vae_scale_factor

from .. import helpers
from ..helpers import STEPS, assert_identical, over_cases, seeded
from .conftest import make_image, run_both

SIZE = {"height": 32, "width": 32}


TEXT2IMAGE_CASES = {
    "plain": {"prompt": "a photo of a cat"},
    "two_per_prompt": {"prompt": "a photo of a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a photo of a cat", "a red dog"], "guidance_scale": 5.0},
    "true_cfg": {"prompt": ["a cat", "a dog"], "negative_prompt": ["blurry", "blue"], "true_cfg_scale": 2.0},
    "prompt_2": {"prompt": "a cat", "prompt_2": "a red horse", "max_sequence_length": 16},
    "size": {"prompt": "a cat", "height": 48, "width": 32, "num_images_per_prompt": 2},
}


@over_cases(TEXT2IMAGE_CASES)
def test_text2image_parity(flux_pipe, case, output_type):
    """Text-to-image equals FluxPipeline for prompts, batches, n per prompt, prompt_2, true CFG and sizes."""
    kwargs = {**SIZE, "num_inference_steps": STEPS, "output_type": output_type, **TEXT2IMAGE_CASES[case]}
    assert_identical(*run_both(flux_pipe, "text2image", **kwargs))


IMAGE2IMAGE_CASES = {
    "default_strength": {"prompt": "a photo of a cat", "num_inference_steps": 3},
    "strength": {"prompt": "a photo of a cat", "strength": 0.8, "num_inference_steps": 4},
    "two_per_prompt": {"prompt": "a cat", "num_images_per_prompt": 2, "strength": 1.0},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "strength": 1.0, "guidance_scale": 3.0},
    "true_cfg": {"prompt": "a cat", "negative_prompt": "blurry", "true_cfg_scale": 1.5, "strength": 1.0},
}


@over_cases(IMAGE2IMAGE_CASES)
def test_image2image_parity(flux_pipe, case, output_type):
    """Image-to-image equals FluxImg2ImgPipeline, including the default strength (0.6) and guidance (7.0)."""
    kwargs = {**SIZE, "num_inference_steps": STEPS, "output_type": output_type, **IMAGE2IMAGE_CASES[case]}
    assert_identical(*run_both(flux_pipe, "image2image", image=make_image(), **kwargs))


CONTROL_CASES = {
    "plain": {"prompt": "a photo of a cat"},
    "two_per_prompt": {"prompt": "a photo of a cat", "num_images_per_prompt": 2},
    "two_prompts": {"prompt": ["a cat", "a red dog"], "guidance_scale": 10.0},
    "tensor_control_image": {"prompt": "a cat", "control_image": torch.rand(1, 3, 32, 32) * 2 - 1},
}


@over_cases(CONTROL_CASES)
def test_control_parity(flux_control_pipe, case, output_type):
    """Control equals FluxControlPipeline: encoded, packed control latents beside the latents each step."""
    kwargs = {
        **SIZE,
        "control_image": make_image(1),
        "num_inference_steps": STEPS,
        "output_type": output_type,
        **CONTROL_CASES[case],
    }
    assert_identical(*run_both(flux_control_pipe, "control", **kwargs))


def test_precomputed_embeddings(flux_pipe):
    """Precomputed T5, pooled CLIP and negative embeddings give what the classic pipeline gives for them."""
    embeds = helpers.random_tensors(
        3,
        prompt_embeds=(2, 8, 32),
        pooled_prompt_embeds=(2, 32),
        negative_prompt_embeds=(2, 8, 32),
        negative_pooled_prompt_embeds=(2, 32),
    )
    kwargs = {**SIZE, **embeds, "true_cfg_scale": 3.0, "num_inference_steps": STEPS, "output_type": "latent"}
    assert_identical(*run_both(flux_pipe, "text2image", **kwargs))


@pytest.mark.parametrize("workflow", ["text2image", "image2image", "control"])
def test_generator_list(flux_pipe, flux_control_pipe, workflow):
    """One generator per image gives the classic result in every workflow."""
    pipe = flux_control_pipe if workflow == "control" else flux_pipe
    extra = {
        "image2image": {"image": make_image(), "strength": 0.9},
        "control": {"control_image": make_image(1)},
    }
    kwargs = {**SIZE, "prompt": "a cat", "num_images_per_prompt": 2, "num_inference_steps": STEPS}
    kwargs.update(extra.get(workflow, {}), output_type="latent")
    assert_identical(*run_both(pipe, workflow, seed=(1, 2), **kwargs))


def test_given_latents_and_sigmas(flux_pipe):
    """Given packed latents and custom sigmas are used as the classic pipeline uses them."""
    latents = torch.randn(1, 64, 16, generator=seeded(5))
    kwargs = {**SIZE, "prompt": "a cat", "latents": latents, "sigmas": [1.0, 0.6, 0.2], "output_type": "np"}
    assert_identical(*run_both(flux_pipe, "text2image", **kwargs))


def test_default_size_and_pil_output(flux_pipe):
    """Without height and width, both make 128 latent cells a side; 'pil' gives the classic pixels."""
    ours, theirs = run_both(
        flux_pipe, "text2image", prompt="a cat", num_inference_steps=1, max_sequence_length=8
    )
    helpers.assert_identical_pil(ours, theirs, size=(256, 256))


def test_transformer_without_guidance_embedding(flux_pipe):
    """A transformer without guidance_embeds (FLUX.1-schnell style) gets no guidance, as in the classic."""
    config = dict(flux_pipe.transformer.config)
    config["guidance_embeds"] = False
    torch.manual_seed(0)
    transformer = type(flux_pipe.transformer).from_config(config).eval()
    original = flux_pipe.transformer
    flux_pipe.update_components(transformer=transformer)
    try:
        kwargs = {**SIZE, "prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent"}
        assert_identical(*run_both(flux_pipe, "text2image", **kwargs))
        assert_identical(*run_both(flux_pipe, "image2image", image=make_image(), **kwargs))
    finally:
        flux_pipe.update_components(transformer=original)


@pytest.mark.parametrize("workflow", ["image2image", "control"])
def test_image_sizes_follow_the_vae_scale_not_16(flux_pipe, flux_control_pipe, workflow):
    """With a VAE of scale 2, a 44x36 image-to-image or control call equals the classic one: images are
    resized to multiples of 4 (an image processor fixed at 16 made 32x32 and failed in torch)."""
    pipe = flux_control_pipe if workflow == "control" else flux_pipe
    assert vae_scale_factor(pipe) == 2
    image = (
        {"control_image": make_image(1, size=50)} if workflow == "control" else {"image": make_image(size=50)}
    )
    helpers.assert_makes_44x36_as_the_classic(run_both, pipe, workflow, height=36, width=44, **image)


def test_size_not_a_multiple_is_rounded_down_as_the_classic(flux_pipe, caplog):
    """height 38 and width 42 (not multiples of 4) make a 36x40 image, as FluxPipeline, with a warning."""
    kwargs = {"prompt": "a cat", "height": 38, "width": 42, "num_inference_steps": STEPS, "output_type": "np"}
    with caplog.at_level("WARNING", logger="blocks.common.checks"):
        ours, theirs = run_both(flux_pipe, "text2image", **kwargs)
    assert_identical(ours, theirs, shape=(1, 36, 40, 3))
    warnings = [r.getMessage() for r in caplog.records if r.name == "blocks.common.checks"]
    assert warnings == [
        "height (38) is not divisible by 4; it is rounded down to 36",
        "width (42) is not divisible by 4; it is rounded down to 40",
    ]
