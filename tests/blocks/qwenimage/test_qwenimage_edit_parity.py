"""Our Qwen-Image-Edit blocks equal diffusers' QwenImageEditPipeline bit for bit on CPU float32."""

import pytest
import torch

from ..helpers import STEPS, assert_identical, assert_identical_pil, over_cases, seeded
from .conftest import make_image, run_both_edit

EDIT_CASES = {
    "plain": {"prompt": "make it red"},
    "negative_prompt": {"prompt": "make it red", "negative_prompt": "blurry"},
    "two_per_prompt": {"prompt": "make it red", "negative_prompt": "blurry", "num_images_per_prompt": 2},
    "no_guidance": {"prompt": ["a cat"], "negative_prompt": ["blurry"], "true_cfg_scale": 1.0},
    "output_size": {"prompt": "a red hat", "negative_prompt": "blurry", "height": 32, "width": 48},
}


@pytest.mark.usefixtures("small_edit_area")
@over_cases(EDIT_CASES)
def test_edit_parity(qwen_edit_pipe, case, output_type):
    """Edit equals QwenImageEditPipeline for prompts, negatives, n per prompt, no CFG and an output size."""
    kwargs = {
        "image": make_image(),
        "num_inference_steps": STEPS,
        "output_type": output_type,
        **EDIT_CASES[case],
    }
    assert_identical(*run_both_edit(qwen_edit_pipe, "edit", **kwargs))


@pytest.mark.usefixtures("small_edit_area")
def test_edit_wide_image_pil_and_generator_list(qwen_edit_pipe):
    """A 64 x 32 image keeps its aspect ratio in the working size (96 x 32: 2:1 at about 64 x 64 pixels, in
    multiples of 32), which is the output size; PIL output and a generator per image match."""
    wide = make_image(size=64, height=32)
    ours, theirs = run_both_edit(
        qwen_edit_pipe, "edit", prompt="a cat", image=wide, num_inference_steps=STEPS
    )
    assert_identical_pil(ours, theirs)
    assert ours[0].size == (96, 32)
    kwargs = {"prompt": "a cat", "image": make_image(), "num_images_per_prompt": 2, "output_type": "latent"}
    assert_identical(*run_both_edit(qwen_edit_pipe, "edit", seed=(1, 2), num_inference_steps=STEPS, **kwargs))


@pytest.mark.usefixtures("small_edit_area")
def test_edit_precomputed_embeddings_and_latents(qwen_edit_pipe):
    """Precomputed embeddings with masks (a batch of two for one image) and given latents match the classic."""
    generator = seeded(3)
    embeds = {
        "prompt_embeds": torch.randn(2, 6, 16, generator=generator),
        "prompt_embeds_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]),
        "negative_prompt_embeds": torch.randn(2, 5, 16, generator=generator),
    }
    latents = torch.randn(2, 16, 16, generator=generator)
    kwargs = {"image": make_image(), "num_inference_steps": STEPS, "output_type": "latent"}
    assert_identical(*run_both_edit(qwen_edit_pipe, "edit", **embeds, **kwargs))
    assert_identical(*run_both_edit(qwen_edit_pipe, "edit", seed=None, latents=latents, **embeds, **kwargs))


def test_edit_parity_at_the_real_area(qwen_edit_pipe):
    """At the classic working area (about 1024 x 1024: 4096 image tokens), a 32 x 32 edit equals the classic's."""
    kwargs = {"prompt": "make it red", "image": make_image(), "height": 32, "width": 32}
    assert_identical(
        *run_both_edit(qwen_edit_pipe, "edit", num_inference_steps=STEPS, output_type="latent", **kwargs)
    )
