"""The Z-Image family: workflows, registration, loading, and bad input on the Z-Image pipeline."""

import json
import shutil

import pytest
import torch

from blocks.z_image import FAMILY, ZImageAutoBlocks, ZImageBeforeDenoiseStep, make_tiny_repo
from modular import InputTypeError, MissingInputError, ModularPipeline

from .. import helpers
from ..helpers import STEPS, workflow_steps
from .conftest import COMPONENTS, SIZE, make_image, run_both


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    expected = {
        "text2image": workflow_steps("check_inputs"),
        "image2image": workflow_steps("img2img_check_inputs", ["img2img_vae_encoder"]),
    }
    chosen = {"image2image": {"prompt": "a cat", "image": make_image()}}
    helpers.assert_workflows(ZImageAutoBlocks(), expected, chosen)


def test_family_is_registered():
    """FAMILY is known by name and serves the classic Z-Image text-to-image and image-to-image classes."""
    helpers.assert_family(FAMILY, "z-image", ZImageAutoBlocks, make_tiny_repo)
    assert set(FAMILY.classic_pipelines) == {"ZImagePipeline", "ZImageImg2ImgPipeline"}


def test_from_pretrained_on_classic_repos(zimage_repo, tmp_path):
    """from_pretrained maps a ZImagePipeline or ZImageImg2ImgPipeline model_index.json to our blocks, loading nothing."""
    img2img_repo = tmp_path / "img2img"
    shutil.copytree(zimage_repo, img2img_repo)
    index = json.loads((img2img_repo / "model_index.json").read_text())
    index["_class_name"] = "ZImageImg2ImgPipeline"
    (img2img_repo / "model_index.json").write_text(json.dumps(index))
    repos = (zimage_repo, img2img_repo)
    helpers.assert_from_pretrained_loads_nothing(repos, ZImageAutoBlocks, COMPONENTS, "transformer")


def test_pruned_workflow_pipeline_matches_classic(zimage_repo, zimage_pipe):
    """A pipeline of the image2image workflow alone, loaded from the repo, gives the classic img2img result."""
    pipe = ModularPipeline.from_pretrained(zimage_repo, workflow="image2image")
    assert "image" in pipe.blocks.input_names
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "image": make_image(), "num_inference_steps": 3, "output_type": "latent"}
    ours, theirs = run_both(pipe, "image2image", classic_on=zimage_pipe, **kwargs)
    assert torch.equal(ours, theirs)


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, Z-Image's defaults and the two workflows."""
    helpers.assert_doc_names(
        ZImageAutoBlocks().doc,
        (*COMPONENTS, "image_processor"),
        "Default: the guider's own (5.0 for the default guider)",
        "strength (float, default: 0.6)",
        "image2image: image, prompt",
    )


def test_output_types_and_default_size(zimage_pipe):
    """'pt' is the 'np' array as a [B, 3, H, W] tensor; without height and width the latents are 1024 px worth."""
    helpers.assert_pt_is_np_transposed(zimage_pipe, SIZE, height=SIZE, width=SIZE)
    preparation = ZImageBeforeDenoiseStep().init_pipeline()
    preparation.update_components(transformer=zimage_pipe.transformer, scheduler=zimage_pipe.scheduler)
    out = preparation(batch_size=1, num_inference_steps=STEPS, output=["latents", "height", "width"])
    assert (out["height"], out["width"]) == (1024, 1024)
    assert out["latents"].shape == (1, 16, 128, 128)  # no VAE loaded: Z-Image's 8 pixels per latent cell


BAD_CALLS = {
    "no_prompt": (
        {},
        ValueError,
        "ZImageTextEncoderStep: pass exactly one of prompt and prompt_embeds (got neither)",
    ),
    "embeds_without_negative": (
        {"prompt_embeds": [torch.zeros(4, 16)]},
        ValueError,
        "ZImageTextEncoderStep: with prompt_embeds and guidance_scale > 0, negative_prompt_embeds is needed too",
    ),
    "embeds_as_tensor": (
        {"prompt_embeds": torch.zeros(1, 4, 16), "guidance_scale": 0.0},
        InputTypeError,
        "input 'prompt_embeds' must be list[Tensor]",
    ),
    "negative_count": (
        {"prompt": ["a cat", "a dog"], "negative_prompt": "blurry"},
        ValueError,
        "ZImageCheckInputsStep: negative_prompt has 1 entry for 2 prompts; pass one per prompt",
    ),
    "height": (
        {"prompt": "a cat", "height": 30},
        ValueError,
        "ZImageCheckInputsStep: height (30) must be divisible by 4; pass a multiple of 4 such as 28 or 32",
    ),
    "latents_shape": (
        {"prompt": "a cat", "latents": torch.zeros(1, 16, 8, 8)},
        ValueError,
        "ZImageCheckInputsStep: latents (shape (1, 16, 8, 8)) must have shape (1, 16, 16, 16) for a batch of 1 "
        "(prompts x num_images_per_prompt) at 32x32 pixels; pass latents of that shape, or none",
    ),
    **helpers.common_bad_calls("ZImage", image=make_image(), no_steps_strength=0.0),
    "image_size": (
        {"prompt": "a cat", "image": make_image(), "height": 48},
        ValueError,
        "ZImageImg2ImgCheckInputsStep: height (48) must be the image's height (32, a multiple of 4): the image is "
        "not resized; leave height and width unset to use the image's size, or resize the image",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(zimage_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    # Image-to-image takes its size from the image unless told.
    size = {} if "image" in kwargs else {"height": SIZE, "width": SIZE}
    call = {"num_inference_steps": STEPS, **size, **kwargs}
    helpers.assert_refused_and_unchanged(zimage_pipe, call, error, message, height=SIZE, width=SIZE)


def test_image2image_workflow_needs_an_image(zimage_repo, zimage_pipe):
    """The image2image workflow's pipeline refuses to run without its image, naming the block and input."""
    pipe = ModularPipeline.from_pretrained(zimage_repo, workflow="image2image")
    pipe.update_components(**{name: getattr(zimage_pipe, name) for name in COMPONENTS})
    with pytest.raises(MissingInputError) as info:
        pipe(prompt="a cat", num_inference_steps=STEPS)
    assert "block 'img2img_vae_encoder' (ZImageVaeEncoderStep) needs input 'image'" in str(info.value)


def test_unloaded_component_is_named(zimage_repo):
    """Calling before load_components names the first missing component and says to load it."""
    helpers.unloaded_component_error(ZImageAutoBlocks, zimage_repo)
