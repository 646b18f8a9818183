"""The SD3 family: workflows, registration, loading, and bad input on the SD3 pipeline."""

import json
import shutil

import pytest
import torch

from blocks.sd3 import FAMILY, SD3AutoBlocks, SD3BeforeDenoiseStep, make_tiny_repo
from modular import MissingInputError, ModularPipeline

from .. import helpers
from ..helpers import STEPS, workflow_steps
from .conftest import COMPONENTS, SIZE, make_image, make_mask, run_both


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    expected = {
        "text2image": workflow_steps("check_inputs", prepare=("prepare_latents", "set_timesteps")),
        "image2image": workflow_steps("img2img_check_inputs", ["img2img_vae_encoder"]),
        "inpainting": [
            "inpaint_check_inputs",
            "text_encoder",
            "input",
            "inpaint_vae_encoder",
            "set_timesteps",
            "prepare_latents",
            "prepare_mask_latents",
            "inpaint_denoise",
            "inpaint_decode",
        ],
    }
    chosen = {
        "image2image": {"prompt": "a cat", "image": make_image()},
        "inpainting": {"prompt": "a cat", "image": make_image(), "mask_image": make_mask()},
    }
    helpers.assert_workflows(SD3AutoBlocks(), expected, chosen)


def test_family_is_registered():
    """FAMILY is known by name and serves the classic SD3 text-to-image, image-to-image and inpainting classes."""
    helpers.assert_family(FAMILY, "stable-diffusion-3", SD3AutoBlocks, make_tiny_repo)
    assert set(FAMILY.classic_pipelines) == {
        "StableDiffusion3Pipeline",
        "StableDiffusion3Img2ImgPipeline",
        "StableDiffusion3InpaintPipeline",
    }
    assert FAMILY.peer_pipeline_class == "StableDiffusion3ModularPipeline"


def test_from_pretrained_on_classic_repos(sd3_repo, sd3_inpaint_repo, tmp_path):
    """from_pretrained maps each classic SD3 model_index.json to our blocks, loading nothing."""
    img2img_repo = tmp_path / "img2img"
    shutil.copytree(sd3_repo, img2img_repo)
    index = json.loads((img2img_repo / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusion3Img2ImgPipeline"
    (img2img_repo / "model_index.json").write_text(json.dumps(index))
    repos = (sd3_repo, img2img_repo, sd3_inpaint_repo)
    helpers.assert_from_pretrained_loads_nothing(repos, SD3AutoBlocks, COMPONENTS, "transformer")


def test_pruned_workflow_pipeline_matches_classic(sd3_repo, sd3_pipe):
    """A pipeline of the inpainting workflow alone, loaded from the repo, gives the classic inpainting result."""
    pipe = ModularPipeline.from_pretrained(sd3_repo, workflow="inpainting")
    assert "mask_image" in pipe.blocks.input_names
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), "num_inference_steps": 3}
    ours, theirs = run_both(pipe, "inpainting", classic_on=sd3_pipe, output_type="latent", **kwargs)
    assert torch.equal(ours, theirs)


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, SD3's defaults and the three workflows."""
    helpers.assert_doc_names(
        SD3AutoBlocks().doc,
        (*COMPONENTS, "image_processor", "mask_processor", "guider"),
        "Default: the guider's own (7.0 for the default guider)",
        "strength (float, default: 0.6)",
        "skip_guidance_layers (list[int]): Transformer layers to skip for skip-layer guidance",
        "inpainting: mask_image, image, prompt",
    )


def test_output_types_and_default_size(sd3_pipe):
    """'pt' is the 'np' array as a [B, 3, H, W] tensor; without a VAE the latents are SD3's 1024 px worth."""
    helpers.assert_pt_is_np_transposed(sd3_pipe, SIZE)
    preparation = SD3BeforeDenoiseStep().init_pipeline()
    preparation.update_components(transformer=sd3_pipe.transformer, scheduler=sd3_pipe.scheduler)
    out = preparation(batch_size=1, num_inference_steps=STEPS, output=["latents", "height", "width"])
    # The tiny transformer's sample size (16 latent cells) at 8 pixels per cell, the fallback without a VAE.
    assert (out["height"], out["width"]) == (128, 128)
    assert out["latents"].shape == (1, 16, 16, 16)


BAD_CALLS = {
    "no_prompt": (
        {},
        ValueError,
        "SD3TextEncoderStep: pass exactly one of prompt and prompt_embeds (got neither)",
    ),
    "embeds_without_pooled": (
        {"prompt_embeds": torch.zeros(1, 93, 80)},
        ValueError,
        "SD3TextEncoderStep: prompt_embeds need pooled_prompt_embeds from the same CLIP encoders",
    ),
    "negative_count": (
        {"prompt": ["a cat", "a dog"], "negative_prompt": ["blurry"]},
        ValueError,
        "SD3CheckInputsStep: negative_prompt has 1 entry for 2 prompts; pass one per prompt, or one string for all",
    ),
    "prompt_2_count": (
        {"prompt": "a cat", "prompt_2": ["a", "b"]},
        ValueError,
        "SD3CheckInputsStep: prompt_2 has 2 entries for 1 prompt; pass one per prompt",
    ),
    "max_sequence_length": (
        {"prompt": "a cat", "max_sequence_length": 600},
        ValueError,
        "SD3CheckInputsStep: max_sequence_length (600) must be at most 512 (T5's limit); pass 512 or less",
    ),
    "height": (
        {"prompt": "a cat", "height": 30},
        ValueError,
        "SD3CheckInputsStep: height (30) must be divisible by 4; pass a multiple of 4 such as 28 or 32",
    ),
    "skip_layers": (
        {"prompt": "a cat", "skip_guidance_layers": [2]},
        ValueError,
        "SD3CheckInputsStep: skip_guidance_layers ([2]) names layers [2] the transformer does not have; pass "
        "indices in [0, 1]",
    ),
    "latents_shape": (
        {"prompt": "a cat", "latents": torch.zeros(1, 16, 8, 8)},
        ValueError,
        "SD3CheckInputsStep: latents (shape (1, 16, 8, 8)) must have shape (1, 16, 16, 16) for a batch of 1 "
        "(prompts x num_images_per_prompt) at 32x32 pixels; pass latents of that shape, or none",
    ),
    **helpers.common_bad_calls("SD3", image=make_image(), no_steps_strength=0.0),
    "mask_count": (
        {
            "prompt": "a cat",
            "image": make_image(),
            "mask_image": [make_mask()] * 2,
            "num_images_per_prompt": 3,
        },
        ValueError,
        "SD3InpaintCheckInputsStep: mask_image holds 2 images for a batch of 3",
    ),
    "padding_mask_crop_output": (
        {
            "prompt": "a cat",
            "image": make_image(),
            "mask_image": make_mask(),
            "padding_mask_crop": 4,
            "output_type": "np",
        },
        ValueError,
        "SD3InpaintCheckInputsStep: padding_mask_crop pastes the result into the original image, which only 'pil' "
        "output does (got output_type 'np')",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(sd3_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    helpers.assert_refused_and_unchanged(sd3_pipe, {"num_inference_steps": STEPS, **kwargs}, error, message)


def test_inpainting_refuses_a_transformer_of_other_channels(sd3_pipe):
    """Inpainting names the transformer's channels when it reads neither the latents alone nor with the mask."""
    config = {**sd3_pipe.transformer.config, "in_channels": 20}
    original = sd3_pipe.transformer
    sd3_pipe.update_components(transformer=type(original).from_config(config))
    try:
        with pytest.raises(ValueError) as info:
            sd3_pipe(prompt="a cat", image=make_image(), mask_image=make_mask(), num_inference_steps=STEPS)
    finally:
        sd3_pipe.update_components(transformer=original)
    assert "the transformer takes 20 input channels; inpainting needs 16 (the latents) or 33" in str(
        info.value
    )


def test_inpainting_workflow_needs_a_mask(sd3_repo, sd3_pipe):
    """The inpainting workflow's pipeline refuses to run without its mask, naming the block and input."""
    pipe = ModularPipeline.from_pretrained(sd3_repo, workflow="inpainting")
    pipe.update_components(**{name: getattr(sd3_pipe, name) for name in COMPONENTS})
    with pytest.raises(MissingInputError) as info:
        pipe(prompt="a cat", image=make_image(), num_inference_steps=STEPS)
    assert "block 'inpaint_vae_encoder' (SD3InpaintVaeEncoderStep) needs input 'mask_image'" in str(
        info.value
    )


def test_unloaded_component_is_named(sd3_repo):
    """Calling before load_components names the first missing component and says to load it."""
    helpers.unloaded_component_error(SD3AutoBlocks, sd3_repo)
