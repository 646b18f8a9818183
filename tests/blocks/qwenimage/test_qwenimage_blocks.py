"""The Qwen-Image family: workflows, registration, loading, and bad input on both pipelines."""

import pytest
import torch

from blocks.qwenimage import (
    FAMILY,
    QwenImageAutoBlocks,
    QwenImageBeforeDenoiseStep,
    QwenImageEditAutoBlocks,
    make_tiny_repo,
)
from modular import InputTypeError, ModularPipeline

from .. import helpers
from ..helpers import STEPS
from .conftest import COMPONENTS, SIZE, make_image

# Edit reads text through the processor: the edit repo's tokenizer folder is not one of its components.
EDIT_COMPONENTS = ("transformer", "vae", "text_encoder", "processor", "scheduler")


def test_workflows_select_the_expected_blocks():
    """Text-to-image runs its six stages; edit adds the resize and VAE encoder steps."""
    prepare = ["prepare_latents", "set_timesteps"]
    helpers.assert_workflows(
        QwenImageAutoBlocks(),
        {"text2image": ["check_inputs", "text_encoder", "input", *prepare, "denoise", "decode"]},
        {"text2image": {"prompt": "a cat"}},
    )
    edit = ["check_inputs", "resize", "text_encoder", "input", "vae_encoder", *prepare, "denoise", "decode"]
    helpers.assert_workflows(QwenImageEditAutoBlocks(), {"edit": edit}, {"edit": {"prompt": "a", "image": 1}})


def test_family_is_registered():
    """FAMILY is known by name, serves both classic classes, and knows the edit blocks as a variant."""
    helpers.assert_family(FAMILY, "qwen-image", QwenImageAutoBlocks, make_tiny_repo)
    assert set(FAMILY.classic_pipelines) == {"QwenImagePipeline", "QwenImageEditPipeline"}
    assert FAMILY.variants == (QwenImageEditAutoBlocks,)


def test_from_pretrained_picks_the_blocks_of_each_classic_repo(qwen_repo, qwen_edit_repo):
    """A QwenImagePipeline repo gets the text-to-image blocks, a QwenImageEditPipeline repo the edit blocks
    (with its processor); nothing is loaded."""
    helpers.assert_from_pretrained_loads_nothing([qwen_repo], QwenImageAutoBlocks, COMPONENTS, "transformer")
    helpers.assert_from_pretrained_loads_nothing(
        [qwen_edit_repo], QwenImageEditAutoBlocks, EDIT_COMPONENTS, "transformer"
    )


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' docs name every component, the classic defaults and the workflows."""
    helpers.assert_doc_names(
        QwenImageAutoBlocks().doc,
        (*COMPONENTS, "image_processor", "guider"),
        "the guider's own (4.0 for the default guider)",
        "max_sequence_length (int, default: 512)",
        "text2image: prompt",
    )
    helpers.assert_doc_names(
        QwenImageEditAutoBlocks().doc, (*EDIT_COMPONENTS, "image_processor"), "edit: image, prompt"
    )


def test_output_types_and_default_size(qwen_pipe):
    """'pt' is the 'np' array as a [B, 3, H, W] tensor; without height and width the latents are 1024 px worth."""
    helpers.assert_pt_is_np_transposed(qwen_pipe, SIZE, height=SIZE, width=SIZE)
    preparation = QwenImageBeforeDenoiseStep().init_pipeline()
    preparation.update_components(transformer=qwen_pipe.transformer, scheduler=qwen_pipe.scheduler)
    inputs = {"batch_size": 1, "dtype": torch.float32, "num_inference_steps": STEPS}
    out = preparation(**inputs, output=["latents", "height", "width", "img_shapes"])
    assert (out["height"], out["width"]) == (1024, 1024)
    # No VAE loaded: 8 pixels per latent cell, 2x2 cells per token of 4 channels x 4.
    assert out["latents"].shape == (1, 64 * 64, 16)
    assert out["img_shapes"] == [[(1, 64, 64)]]


BAD_CALLS = {
    "no_prompt": (
        {},
        ValueError,
        "QwenImageCheckInputsStep: pass exactly one of prompt and prompt_embeds (got neither)",
    ),
    "both_negatives": (
        {"prompt": "a cat", "negative_prompt": "blurry", "negative_prompt_embeds": torch.zeros(1, 3, 16)},
        ValueError,
        "QwenImageCheckInputsStep: pass at most one of negative_prompt and negative_prompt_embeds (got both)",
    ),
    "negative_count": (
        {"prompt": ["a cat", "a dog", "a red dog"], "negative_prompt": ["blurry", "blue"]},
        ValueError,
        "QwenImageCheckInputsStep: negative_prompt has 2 entries for 3 prompts; pass one per prompt",
    ),
    "mask_shape": (
        {"prompt_embeds": torch.zeros(1, 4, 16), "prompt_embeds_mask": torch.ones(1, 5)},
        ValueError,
        "QwenImageCheckInputsStep: prompt_embeds_mask (shape (1, 5)) must have prompt_embeds's batch and length (1, 4)",
    ),
    "max_sequence_length": (
        {"prompt": "a cat", "max_sequence_length": 2000},
        ValueError,
        "QwenImageCheckInputsStep: max_sequence_length (2000) must be in [1, 1024]; pass at most 1024",
    ),
    "height": (
        {"prompt": "a cat", "height": 8},
        ValueError,
        "QwenImageCheckInputsStep: height (8) must be at least 16; pass 16 or more, or leave height unset",
    ),
    "latents_shape": (
        {"prompt": "a cat", "latents": torch.zeros(1, 16, 8)},
        ValueError,
        "QwenImageCheckInputsStep: latents (shape (1, 16, 8)) must have shape (1, 4, 16) for a batch of 1 "
        "(prompts x num_images_per_prompt) at 32x32 pixels; pass latents of that shape, or none",
    ),
    "output_type": (
        {"prompt": "a cat", "output_type": "jpeg"},
        ValueError,
        "QwenImageCheckInputsStep: output_type ('jpeg') must be one of ['pil', 'np', 'pt', 'latent']",
    ),
    "generators": (
        {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
        ValueError,
        "a list of generators needs one per image (got 3 for a batch of 1",
    ),
    "prompt_type": ({"prompt": 3}, InputTypeError, "input 'prompt' must be"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(qwen_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    call = {"num_inference_steps": STEPS, "height": SIZE, "width": SIZE, **kwargs}
    helpers.assert_refused_and_unchanged(qwen_pipe, call, error, message, height=SIZE, width=SIZE)


EDIT_BAD_CALLS = {
    "image_not_pil": (
        {"prompt": "make it red", "image": torch.zeros(1, 3, 32, 32)},
        TypeError,
        "QwenImageEditCheckInputsStep: image must be one PIL image (got Tensor)",
    ),
    "two_prompts": (
        {"prompt": ["make it red", "make it blue"], "image": make_image()},
        ValueError,
        "QwenImageEditCheckInputsStep: prompt has 2 entries, but the edit encodes each prompt with the one image",
    ),
    "no_image": ({"prompt": "make it red"}, ValueError, "needs input 'image'"),
}


@pytest.mark.usefixtures("small_edit_area")
@pytest.mark.parametrize("case", list(EDIT_BAD_CALLS))
def test_bad_edit_input_raises_and_leaves_pipeline_working(qwen_edit_pipe, case):
    """Each bad edit call raises a clear error naming the block or input; the next good call is unchanged."""
    kwargs, error, message = EDIT_BAD_CALLS[case]
    call = {"num_inference_steps": STEPS, **kwargs}
    helpers.assert_refused_and_unchanged(qwen_edit_pipe, call, error, message, image=make_image())


def test_unloaded_component_is_named(qwen_repo):
    """Calling before load_components names the first missing component and says to load it."""
    helpers.unloaded_component_error(QwenImageAutoBlocks, qwen_repo)


def test_a_text2image_repo_saved_by_us_loads_back_with_its_blocks(qwen_pipe, tmp_path):
    """Our pipeline saved and read back builds the same blocks and gives the same images."""
    qwen_pipe.save_pretrained(tmp_path / "saved")
    again = ModularPipeline.from_pretrained(tmp_path / "saved")
    assert isinstance(again.blocks, QwenImageAutoBlocks)
    again.load_components(torch_dtype=torch.float32)
    again.set_progress_bar_config(disable=True)
    kwargs = {"height": SIZE, "width": SIZE}
    assert torch.equal(
        torch.from_numpy(helpers.reference(again, **kwargs)),
        torch.from_numpy(helpers.reference(qwen_pipe, **kwargs)),
    )
