"""The Stable Diffusion family: workflows, registration, docs, and bad input on the SD pipeline."""

import pytest
import torch

from blocks.stable_diffusion import FAMILY, StableDiffusionAutoBlocks, make_tiny_repo
from modular import MissingInputError, ModularPipeline, UnknownInputError

from .. import helpers
from ..helpers import STEPS, make_image, make_mask, workflow_steps
from .conftest import SD, run_both


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    expected = {
        "text2image": workflow_steps("check_inputs"),
        "image2image": workflow_steps("img2img_check_inputs", ["img2img_vae_encoder"]),
        "inpainting": workflow_steps(
            "inpaint_check_inputs", ["inpaint_vae_encoder"], denoise="inpaint_denoise"
        ),
    }
    chosen = {"image2image": {"prompt": "a cat", "image": make_image()}}
    helpers.assert_workflows(StableDiffusionAutoBlocks(), expected, chosen)


def test_family_is_registered():
    """The entry point names FAMILY, which serves the three classic SD pipeline classes."""
    helpers.assert_family(FAMILY, "stable-diffusion", StableDiffusionAutoBlocks, make_tiny_repo)
    assert set(FAMILY.classic_pipelines) == {
        "StableDiffusionPipeline",
        "StableDiffusionImg2ImgPipeline",
        "StableDiffusionInpaintPipeline",
    }


def test_from_pretrained_on_classic_repos(sd_repo, sd_inpaint_repo):
    """from_pretrained maps a classic SD or SD-inpainting model_index.json to the SD blocks, loading nothing."""
    repos = (sd_repo, sd_inpaint_repo)
    helpers.assert_from_pretrained_loads_nothing(repos, StableDiffusionAutoBlocks, SD.components, "unet")


def test_pruned_workflow_pipeline_matches_classic(sd_repo, sd_pipe):
    """A pipeline of the image2image workflow alone gives the classic img2img result."""
    pipe = ModularPipeline.from_pretrained(sd_repo, workflow="image2image")
    assert "mask_image" not in pipe.blocks.input_names
    pipe.update_components(**{name: getattr(sd_pipe, name) for name in SD.components})
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "image": make_image(), "num_inference_steps": 3, "output_type": "latent"}
    ours, theirs = run_both(pipe, "image2image", classic_on=sd_pipe, **kwargs)
    assert torch.equal(ours, theirs)


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, the SD inputs with defaults, and the three workflows."""
    helpers.assert_doc_names(
        StableDiffusionAutoBlocks().doc,
        (*SD.components, "image_processor", "mask_processor"),
        "guidance_scale (float): Classifier-free guidance scale; 1.0 or less turns guidance off. Default: the guider's own (7.5 for the default guider)",
        "inpainting: mask_image, image, prompt",
    )


def test_output_types(sd_pipe):
    """output_type 'pt' gives a [B, 3, H, W] tensor in [0, 1] equal to the 'np' array transposed."""
    helpers.assert_pt_is_np_transposed(sd_pipe, 64)


BAD_CALLS = {
    "prompt_and_embeds": (
        {"prompt": "a cat", "prompt_embeds": torch.zeros(1, 77, 32)},
        ValueError,
        "StableDiffusionTextEncoderStep: pass exactly one of prompt and prompt_embeds (got both)",
    ),
    "no_prompt": (
        {},
        ValueError,
        "StableDiffusionTextEncoderStep: pass exactly one of prompt and prompt_embeds (got neither)",
    ),
    "negative_type": (
        {"prompt": ["a cat"], "negative_prompt": "blurry"},
        TypeError,
        "StableDiffusionCheckInputsStep: negative_prompt (a str) must have the type of prompt (a list); "
        "pass both as str or both as list",
    ),
    "negative_count": (
        {"prompt": ["a cat", "a dog"], "negative_prompt": ["blurry"]},
        ValueError,
        "StableDiffusionCheckInputsStep: negative_prompt has 1 entry for 2 prompts; pass one per prompt",
    ),
    **helpers.common_bad_calls("StableDiffusion", image=make_image(), no_steps_strength=0.1),
    "mask_without_image": (
        {"prompt": "a cat", "mask_image": make_mask()},
        MissingInputError,
        "block 'inpaint_vae_encoder' (StableDiffusionInpaintVaeEncoderStep) needs input 'image'",
    ),
    "misspelled": ({"promt": "a cat"}, UnknownInputError, "did you mean 'prompt'?"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(sd_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    helpers.assert_refused_and_unchanged(sd_pipe, {"num_inference_steps": STEPS, **kwargs}, error, message)


def test_unloaded_component_is_named(sd_repo):
    """Calling before load_components names the first missing component and says to load it."""
    assert "load_components" in helpers.unloaded_component_error(StableDiffusionAutoBlocks, sd_repo)
