"""The SDXL family: workflows, registration, from_pretrained, and bad input on the SDXL pipelines."""

import pytest
import torch

from blocks.stable_diffusion_xl import (
    FAMILY,
    StableDiffusionXLAutoBlocks,
    StableDiffusionXLRefinerBlocks,
    make_tiny_repo,
)
from modular import MissingInputError, ModularPipeline, UnknownInputError

from .. import helpers
from ..helpers import STEPS, make_image, make_mask, workflow_steps
from .conftest import COMPONENTS, run_both


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    prepare = ["set_timesteps", "prepare_latents", "prepare_add_cond"]
    expected = {
        "text2image": workflow_steps("check_inputs", prepare=prepare),
        "image2image": workflow_steps("img2img_check_inputs", ["img2img_vae_encoder"], prepare),
        "inpainting": workflow_steps(
            "inpaint_check_inputs", ["inpaint_vae_encoder"], prepare, "inpaint_denoise"
        ),
    }
    chosen = {"image2image": {"prompt": "a cat", "image": make_image()}}
    helpers.assert_workflows(StableDiffusionXLAutoBlocks(), expected, chosen)


def test_family_is_registered():
    """FAMILY is known by name and serves the classic SDXL text-to-image and image-to-image classes."""
    helpers.assert_family(FAMILY, "stable-diffusion-xl", StableDiffusionXLAutoBlocks, make_tiny_repo)
    assert set(FAMILY.classic_pipelines) == {
        "StableDiffusionXLPipeline",
        "StableDiffusionXLImg2ImgPipeline",
        "StableDiffusionXLInpaintPipeline",
    }


def test_from_pretrained_matches_classic(sdxl_repo, sdxl_inpaint_repo, sdxl_pipe):
    """from_pretrained maps SDXL model_index.json files to the SDXL blocks; loaded, it gives the classic result."""
    assert isinstance(ModularPipeline.from_pretrained(sdxl_inpaint_repo).blocks, StableDiffusionXLAutoBlocks)
    pipe = ModularPipeline.from_pretrained(sdxl_repo)
    assert isinstance(pipe.blocks, StableDiffusionXLAutoBlocks)
    assert set(pipe.null_component_names) == set(COMPONENTS)
    assert pipe.force_zeros_for_empty_prompt is True
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent"}
    ours, theirs = run_both(pipe, "text2image", classic_on=sdxl_pipe, **kwargs)
    assert torch.equal(ours, theirs)


def test_refiner_blocks_bind_to_refiner_repo(sdxl_refiner_repo):
    """The refiner blocks need only text_encoder_2 and read the repo's refiner config values."""
    pipe = StableDiffusionXLRefinerBlocks().init_pipeline(sdxl_refiner_repo)
    assert "text_encoder" not in pipe.component_names and "text_encoder_2" in pipe.component_names
    assert pipe.requires_aesthetics_score is True
    assert pipe.force_zeros_for_empty_prompt is False


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names both encoders, SDXL's inputs with their defaults, and both workflows."""
    helpers.assert_doc_names(
        StableDiffusionXLAutoBlocks().doc,
        ("unet", "vae", "text_encoder", "text_encoder_2", "tokenizer_2", "scheduler"),
        "guidance_scale (float): Classifier-free guidance scale; 1.0 or less turns guidance off. Default: the guider's own (5.0 for the default guider)",
        "aesthetic_score (float, default: 6.0)",
        "image2image: image, prompt",
        "inpainting: mask_image, image, prompt",
    )


BAD_CALLS = {
    "no_prompt": (
        {},
        ValueError,
        "StableDiffusionXLTextEncoderStep: pass exactly one of prompt and prompt_embeds (got neither)",
    ),
    "embeds_without_pooled": (
        {"prompt_embeds": torch.zeros(1, 77, 64)},
        ValueError,
        "with prompt_embeds pass pooled_prompt_embeds too",
    ),
    "negative_count": (
        {"prompt": ["a cat", "a dog"], "negative_prompt": ["blurry"]},
        ValueError,
        "StableDiffusionXLCheckInputsStep: negative_prompt has 1 entry for 2 prompts; pass one per prompt, "
        "or one string for all",
    ),
    "prompt_2_count": (
        {"prompt": ["a cat", "a dog"], "prompt_2": "blurry"},
        ValueError,
        "prompt_2 needs one entry per prompt (got 1 for 2 prompts)",
    ),
    **helpers.common_bad_calls("StableDiffusionXL", image=make_image(), no_steps_strength=0.3),
    # Replaces the common case: SDXL's leaves strength at its default, 0.3.
    "no_steps_left": (
        {"prompt": "a cat", "image": make_image()},
        ValueError,
        "StableDiffusionXLImg2ImgCheckInputsStep: strength (0.3) with num_inference_steps (2) leaves 0 "
        "denoising steps; raise strength or num_inference_steps",
    ),
    "start_after_end": (
        {"prompt": "a cat", "image": make_image(), "denoising_start": 0.8, "denoising_end": 0.5},
        ValueError,
        "denoising_start (0.8) must be below denoising_end (0.5)",
    ),
    "mask_without_image": (
        {"prompt": "a cat", "mask_image": make_mask()},
        MissingInputError,
        "block 'inpaint_vae_encoder' (StableDiffusionXLInpaintVaeEncoderStep) needs input 'image'",
    ),
    "misspelled": ({"prompt": "a cat", "promt_2": "a dog"}, UnknownInputError, "did you mean 'prompt_2'?"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(sdxl_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    helpers.assert_refused_and_unchanged(sdxl_pipe, {"num_inference_steps": STEPS, **kwargs}, error, message)


def test_time_ids_that_do_not_fit_the_unet(sdxl_pipe):
    """Aesthetic-score ids on a base UNet are refused, naming the sizes and the config to change."""
    sdxl_pipe.update_components(requires_aesthetics_score=True)
    try:
        with pytest.raises(ValueError) as info:
            sdxl_pipe(prompt="a cat", image=make_image(), strength=1.0, num_inference_steps=STEPS)
    finally:
        sdxl_pipe.update_components(requires_aesthetics_score=False)
    assert "takes 80 values, but 5 time ids x 8 + a pooled embedding of 32 make 72" in str(info.value)


def test_refiner_without_image_is_refused(sdxl_refiner_pipe):
    """The refiner is image-to-image only: a call without an image names the block and the missing input."""
    with pytest.raises(MissingInputError) as info:
        sdxl_refiner_pipe(prompt="a cat", num_inference_steps=STEPS)
    assert "block 'vae_encoder' (StableDiffusionXLVaeEncoderStep) needs input 'image'" in str(info.value)
