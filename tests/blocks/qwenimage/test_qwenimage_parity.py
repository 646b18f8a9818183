"""Our Qwen-Image blocks equal diffusers' QwenImagePipeline bit for bit on CPU float32."""

import pytest
import torch

from .. import helpers
from ..helpers import STEPS, assert_identical, over_cases, seeded
from .conftest import SIZE, run_both

TEXT2IMAGE_CASES = {
    **helpers.PROMPT_CASES,
    "no_guidance": {
        "prompt": ["a photo of a cat", "a red dog"],
        "negative_prompt": ["blurry", "blue"],
        "true_cfg_scale": 1.0,
    },
    "negative_two_per_prompt": {"prompt": "a cat", "negative_prompt": "a dog", "num_images_per_prompt": 2},
    "size_and_length": {"prompt": "the astronaut", "height": 48, "width": 32, "max_sequence_length": 3},
    "scale": {"prompt": "a cat", "negative_prompt": "blurry", "true_cfg_scale": 7.5},
}


@over_cases(TEXT2IMAGE_CASES)
def test_text2image_parity(qwen_pipe, case, output_type):
    """Text-to-image equals QwenImagePipeline for prompts, negatives, batches, n per prompt, scales and sizes."""
    kwargs = {"height": SIZE, "width": SIZE, **TEXT2IMAGE_CASES[case]}
    kwargs.update(num_inference_steps=STEPS, output_type=output_type)
    assert_identical(*run_both(qwen_pipe, "text2image", **kwargs))


@pytest.mark.parametrize("with_masks", [True, False])
def test_text2image_precomputed_embeddings(qwen_pipe, with_masks):
    """Precomputed embeddings (and masks with padding, or none) give the classic result, with true CFG."""
    generator = seeded(3)
    embeds = {
        "prompt_embeds": torch.randn(2, 6, 16, generator=generator),
        "negative_prompt_embeds": torch.randn(2, 4, 16, generator=generator),
    }
    if with_masks:
        embeds["prompt_embeds_mask"] = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
        embeds["negative_prompt_embeds_mask"] = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    kwargs = {"height": SIZE, "width": SIZE, "num_inference_steps": STEPS, "output_type": "latent"}
    assert_identical(*run_both(qwen_pipe, "text2image", num_images_per_prompt=2, **embeds, **kwargs))


def test_text2image_latents_sigmas_and_generator_list(qwen_pipe):
    """Given packed latents, custom sigmas, and a list of generators (one per image) give the classic result."""
    base = {"prompt": "a cat", "num_images_per_prompt": 2, "height": SIZE, "width": SIZE}
    latents = torch.randn(2, 4, 16, generator=seeded(5))
    cases = [
        {"latents": latents, "num_inference_steps": STEPS, "output_type": "np"},
        {"sigmas": [1.0, 0.8, 0.3], "num_inference_steps": 3, "output_type": "latent"},
    ]
    for extra in cases:
        assert_identical(*run_both(qwen_pipe, "text2image", **base, **extra))
    kwargs = {**base, "num_inference_steps": STEPS, "output_type": "latent", "negative_prompt": "blurry"}
    assert_identical(*run_both(qwen_pipe, "text2image", seed=(1, 2), **kwargs))


def test_pil_output(qwen_pipe):
    """output_type='pil' (the default) gives PIL images with the classic pipeline's pixels."""
    ours, theirs = run_both(
        qwen_pipe, "text2image", prompt="a cat", height=SIZE, width=SIZE, num_inference_steps=STEPS
    )
    helpers.assert_identical_pil(ours, theirs, size=(SIZE, SIZE))


def test_size_not_a_multiple_is_rounded_down_as_the_classic(qwen_pipe):
    """A 40 x 36 request makes the classic's 32 x 32 image (rounded down to multiples of 16), not an error."""
    kwargs = {"prompt": "a cat", "height": 40, "width": 36, "num_inference_steps": STEPS, "output_type": "np"}
    assert_identical(*run_both(qwen_pipe, "text2image", **kwargs), shape=(1, 32, 32, 3))
