"""Our Flux.2 Klein blocks equal diffusers' Flux2KleinPipeline bit for bit on CPU float32: true classifier-free
guidance through the guider, a distilled repo without it, reference images, and the unpacked latent output."""

import logging

import pytest
import torch
from diffusers.guiders import ClassifierFreeGuidance

from blocks.flux2 import FAMILY, Flux2AutoBlocks, Flux2KleinBaseAutoBlocks
from modular import ModularPipeline

from ..helpers import STEPS, assert_identical, forwards_of, over_cases, seeded
from .conftest import KLEIN, SIZE, make_image

run_both = KLEIN.run_both

CASES = {
    "guided": {"prompt": "a photo of a cat"},
    "two_prompts_two_each": {"prompt": ["a photo of a cat", "a red dog"], "num_images_per_prompt": 2},
    "scale": {"prompt": "a cat", "guidance_scale": 2.5, "max_sequence_length": 24},
    "no_guidance": {"prompt": "a cat", "guidance_scale": 1.0},
    "reference_images": {"prompt": "a cat", "image": [make_image(), make_image(1, 64, 96)]},
}


@over_cases(CASES)
def test_klein_parity(klein_pipe, case, output_type):
    """Klein equals Flux2KleinPipeline with and without guidance, for batches and reference images."""
    kwargs = {"height": SIZE, "width": SIZE, **CASES[case]}
    if "image" in kwargs:
        del kwargs["height"], kwargs["width"]
    workflow = "image_conditioned" if "image" in kwargs else "text2image"
    kwargs.update(num_inference_steps=STEPS, output_type=output_type)
    assert_identical(*run_both(klein_pipe, workflow, **kwargs))


def test_latent_output_is_the_vaes_latents(klein_pipe):
    """output_type='latent' gives the unpacked VAE latents [B, C, H, W], as the classic Klein pipeline."""
    kwargs = {"prompt": "a cat", "height": SIZE, "width": 48, "num_inference_steps": STEPS}
    ours, theirs = run_both(klein_pipe, "text2image", output_type="latent", **kwargs)
    assert_identical(ours, theirs, shape=(1, 4, 16, 24))


def test_precomputed_embeddings(klein_pipe):
    """Precomputed prompt_embeds and negative_prompt_embeds give the classic result."""
    generator = seeded(3)
    embeds, negative = (
        torch.randn(1, 10, 48, generator=generator),
        torch.randn(1, 10, 48, generator=generator),
    )
    kwargs = {"height": SIZE, "width": SIZE, "num_inference_steps": STEPS, "output_type": "latent"}
    ours, theirs = run_both(
        klein_pipe,
        "text2image",
        prompt_embeds=embeds,
        negative_prompt_embeds=negative,
        num_images_per_prompt=2,
        **kwargs,
    )
    assert_identical(ours, theirs)


def test_the_guider_decides_the_scale(klein_pipe):
    """A guider of scale 2.5 gives the classic result at guidance_scale 2.5; guidance changes the result."""
    kwargs = {
        "prompt": "a cat",
        "height": SIZE,
        "width": SIZE,
        "num_inference_steps": STEPS,
        "output_type": "latent",
    }
    original = klein_pipe.guider
    klein_pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=2.5))
    try:
        ours = klein_pipe(generator=seeded(0), output="images", **kwargs)
    finally:
        klein_pipe.update_components(guider=original)
    _, theirs = run_both(klein_pipe, "text2image", guidance_scale=2.5, **kwargs)
    assert_identical(ours, theirs)
    unguided = klein_pipe(generator=seeded(0), output="images", guidance_scale=1.0, **kwargs)
    assert not torch.equal(ours, unguided)


def test_a_distilled_repo_runs_no_guidance(klein_distilled_pipe, caplog):
    """With is_distilled in the repo's config the scale is ignored (one pass a step) with a warning, as in the
    classic pipeline."""
    assert klein_distilled_pipe.is_distilled is True
    kwargs = {
        "prompt": "a cat",
        "height": SIZE,
        "width": SIZE,
        "num_inference_steps": STEPS,
        "output_type": "latent",
    }
    ours, theirs = run_both(
        klein_distilled_pipe, "text2image", classic_config={"is_distilled": True}, **kwargs
    )
    assert_identical(ours, theirs)
    with caplog.at_level(logging.WARNING, logger="blocks.flux2.klein_encoders"):
        ignored = klein_distilled_pipe(generator=seeded(0), output="images", guidance_scale=7.0, **kwargs)
    assert torch.equal(ours, ignored)
    assert "guidance_scale 7.0 is ignored: the pipeline is step-distilled" in caplog.text


def test_klein_repos_get_the_klein_blocks(klein_repo, flux2_repo):
    """from_pretrained picks the Klein blocks for a Flux2KleinPipeline repo and the FLUX.2 ones otherwise."""
    assert "Flux2KleinPipeline" in FAMILY.classic_pipelines
    assert type(ModularPipeline.from_pretrained(klein_repo).blocks) is Flux2KleinBaseAutoBlocks
    assert type(ModularPipeline.from_pretrained(flux2_repo).blocks) is Flux2AutoBlocks


@pytest.mark.parametrize("output_type", ["latent", "np"])
def test_klein_callback_and_generator_list(klein_pipe, output_type):
    """A callback halving the latents at step 0, with one generator per image, equals the classic pipeline."""

    def halve(pipeline, step, timestep, callback_kwargs):
        return {"latents": callback_kwargs["latents"] * 0.5} if step == 0 else {}

    kwargs = {
        "prompt": "a cat",
        "height": SIZE,
        "width": SIZE,
        "num_images_per_prompt": 2,
        "num_inference_steps": STEPS,
    }
    ours, theirs = run_both(
        klein_pipe, "text2image", seed=(1, 2), callback_on_step_end=halve, output_type=output_type, **kwargs
    )
    assert_identical(ours, theirs)


def test_a_cfg_cutoff_callback_equals_the_classic(klein_pipe):
    """A callback that sets pipeline._guidance_scale to 0 at step 0 turns guidance off for the later steps, as in
    the classic Klein pipeline (which reads the flag at every step)."""

    def cutoff(pipeline, step, timestep, callback_kwargs):
        if step == 0:
            pipeline._guidance_scale = 0.0
        return {}

    kwargs = {
        "prompt": "a cat",
        "height": SIZE,
        "width": SIZE,
        "num_inference_steps": 3,
        "output_type": "latent",
    }
    ours, theirs = run_both(klein_pipe, "text2image", callback_on_step_end=cutoff, **kwargs)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, klein_pipe(generator=seeded(0), output="images", **kwargs))


def test_negative_embeddings_of_another_batch_are_refused(klein_pipe):
    """negative_prompt_embeds for 2 prompts beside prompt_embeds for 1 is refused before the transformer runs."""
    kwargs = {"height": SIZE, "width": SIZE, "num_inference_steps": STEPS}
    with forwards_of(klein_pipe.transformer) as calls, pytest.raises(ValueError) as info:
        klein_pipe(
            prompt_embeds=torch.zeros(1, 8, 48), negative_prompt_embeds=torch.zeros(2, 8, 48), **kwargs
        )
    assert str(info.value) == (
        "Flux2KleinInputStep: negative_prompt_embeds holds 2 prompts for 1 in prompt_embeds; pass one per prompt"
    )
    assert calls == []
