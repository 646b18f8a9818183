"""The Stable Diffusion family: workflows, registration, docs, and bad input on the SD pipeline."""

import numpy as np
import pytest
import torch

from blocks.stable_diffusion import FAMILY, StableDiffusionAutoBlocks, make_tiny_repo
from modular import (
    ComponentNotLoadedError,
    InputTypeError,
    MissingInputError,
    ModularPipeline,
    UnknownInputError,
    available_families,
)

from .conftest import classic_from, make_image, make_mask

STEPS = 2


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    blocks = StableDiffusionAutoBlocks()
    assert blocks.available_workflows == ["text2image", "image2image", "inpainting"]
    common = ["text_encoder", "input"]
    expected = {
        "text2image": ["check_inputs", *common, "set_timesteps", "prepare_latents", "denoise", "decode"],
        "image2image": [
            "img2img_check_inputs",
            *common,
            "img2img_vae_encoder",
            "set_timesteps",
            "prepare_latents",
            "denoise",
            "decode",
        ],
        "inpainting": [
            "inpaint_check_inputs",
            *common,
            "inpaint_vae_encoder",
            "set_timesteps",
            "prepare_latents",
            "inpaint_denoise",
            "decode",
        ],
    }
    for workflow, names in expected.items():
        assert list(blocks.get_workflow(workflow).sub_blocks) == names
    chosen = blocks.get_execution_blocks(prompt="a cat", image=make_image())
    assert list(chosen.sub_blocks) == expected["image2image"]


def test_family_is_registered():
    """The entry point names FAMILY, which serves the three classic SD pipeline classes."""
    assert available_families()["stable-diffusion"] is FAMILY
    assert FAMILY.blocks_class is StableDiffusionAutoBlocks
    assert FAMILY.make_tiny_repo is make_tiny_repo
    assert set(FAMILY.classic_pipelines) == {
        "StableDiffusionPipeline",
        "StableDiffusionImg2ImgPipeline",
        "StableDiffusionInpaintPipeline",
    }


def test_from_pretrained_on_classic_repos(sd_repo, sd_inpaint_repo):
    """from_pretrained maps a classic SD or SD-inpainting model_index.json to the SD blocks, loading nothing."""
    for repo in (sd_repo, sd_inpaint_repo):
        pipe = ModularPipeline.from_pretrained(repo)
        assert isinstance(pipe.blocks, StableDiffusionAutoBlocks)
        assert set(pipe.null_component_names) == {"unet", "vae", "text_encoder", "tokenizer", "scheduler"}
        assert pipe.get_component_spec("unet").load_id == f"{repo}|unet|null|null"


def test_pruned_workflow_pipeline_matches_classic(sd_repo, sd_pipe):
    """A pipeline of the image2image workflow alone gives the classic img2img result."""
    pipe = ModularPipeline.from_pretrained(sd_repo, workflow="image2image")
    assert "mask_image" not in pipe.blocks.input_names
    pipe.update_components(
        **{name: getattr(sd_pipe, name) for name in ("unet", "vae", "text_encoder", "tokenizer", "scheduler")}
    )
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "image": make_image(), "num_inference_steps": 3, "output_type": "latent"}
    ours = pipe(generator=torch.Generator("cpu").manual_seed(0), output="images", **kwargs)
    theirs = classic_from(sd_pipe, "image2image")(
        generator=torch.Generator("cpu").manual_seed(0), **kwargs
    ).images
    assert torch.equal(ours, theirs)


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, the SD inputs with defaults, and the three workflows."""
    doc = StableDiffusionAutoBlocks().doc
    for name in (
        "unet",
        "vae",
        "text_encoder",
        "tokenizer",
        "scheduler",
        "image_processor",
        "mask_processor",
    ):
        assert f"    {name} (" in doc
    assert "guidance_scale (float, default: 7.5)" in doc
    assert "inpainting: mask_image, image, prompt" in doc


def test_output_types(sd_pipe):
    """output_type 'pt' gives a [B, 3, H, W] tensor in [0, 1] equal to the 'np' array transposed."""
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, "output": "images"}
    as_pt = sd_pipe(output_type="pt", generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    as_np = sd_pipe(output_type="np", generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    assert as_pt.shape == (1, 3, 64, 64)
    assert 0 <= as_pt.min() and as_pt.max() <= 1
    assert torch.equal(as_pt.permute(0, 2, 3, 1), torch.from_numpy(as_np))


def reference(pipe):
    """A fixed small call, to check that a failed call left the pipeline working as before."""
    return pipe(
        prompt="a cat",
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        output="images",
    )


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
    "output_type": (
        {"prompt": "a cat", "output_type": "jpeg"},
        ValueError,
        "StableDiffusionCheckInputsStep: output_type ('jpeg') must be one of ['pil', 'np', 'pt', 'latent']; "
        "pass one of those",
    ),
    "strength": (
        {"prompt": "a cat", "image": make_image(), "strength": 1.5},
        ValueError,
        "StableDiffusionImg2ImgCheckInputsStep: strength (1.5) must be in [0, 1]; pass 0 to keep the image, "
        "1 to replace it, or a value between",
    ),
    "no_steps_left": (
        {"prompt": "a cat", "image": make_image(), "strength": 0.1},
        ValueError,
        "StableDiffusionImg2ImgCheckInputsStep: strength (0.1) with num_inference_steps (2) leaves 0 "
        "denoising steps; raise strength or num_inference_steps",
    ),
    "generators": (
        {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
        ValueError,
        "a list of generators needs one per image (got 3 for a batch of 1",
    ),
    "mask_without_image": (
        {"prompt": "a cat", "mask_image": make_mask()},
        MissingInputError,
        "block 'inpaint_vae_encoder' (StableDiffusionInpaintVaeEncoderStep) needs input 'image'",
    ),
    "image_type": ({"prompt": "a cat", "image": "cat.png"}, InputTypeError, "input 'image' must be"),
    "misspelled": ({"promt": "a cat"}, UnknownInputError, "did you mean 'prompt'?"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(sd_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    before = reference(sd_pipe)
    kwargs, error, message = BAD_CALLS[case]
    kwargs = {"num_inference_steps": STEPS, **kwargs}
    with pytest.raises(error) as info:
        sd_pipe(**kwargs)
    assert message in str(info.value)
    assert np.array_equal(reference(sd_pipe), before)


def test_unloaded_component_is_named(sd_repo):
    """Calling before load_components names the first missing component and says to load it."""
    pipe = StableDiffusionAutoBlocks().init_pipeline(sd_repo)
    with pytest.raises(ComponentNotLoadedError) as info:
        pipe(prompt="a cat")
    assert "needs component 'text_encoder', which is not loaded" in str(info.value)
    assert "load_components" in str(info.value)
