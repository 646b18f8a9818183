"""The SDXL family: workflows, registration, from_pretrained, and bad input on the SDXL pipelines."""

import numpy as np
import pytest
import torch

from blocks.stable_diffusion_xl import (
    FAMILY,
    StableDiffusionXLAutoBlocks,
    StableDiffusionXLRefinerBlocks,
    make_tiny_repo,
)
from modular import InputTypeError, MissingInputError, ModularPipeline, UnknownInputError, available_families

from .conftest import COMPONENTS, classic_from, make_image, make_mask

STEPS = 2


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    blocks = StableDiffusionXLAutoBlocks()
    assert blocks.available_workflows == ["text2image", "image2image", "inpainting"]
    prepare = ["set_timesteps", "prepare_latents", "prepare_add_cond"]
    expected = {
        "text2image": ["check_inputs", "text_encoder", "input", *prepare, "denoise", "decode"],
        "image2image": [
            "img2img_check_inputs",
            "text_encoder",
            "input",
            "img2img_vae_encoder",
            *prepare,
            "denoise",
            "decode",
        ],
        "inpainting": [
            "inpaint_check_inputs",
            "text_encoder",
            "input",
            "inpaint_vae_encoder",
            *prepare,
            "inpaint_denoise",
            "decode",
        ],
    }
    for workflow, names in expected.items():
        assert list(blocks.get_workflow(workflow).sub_blocks) == names
    chosen = blocks.get_execution_blocks(prompt="a cat", image=make_image())
    assert list(chosen.sub_blocks) == expected["image2image"]


def test_family_is_registered():
    """FAMILY is known by name and serves the classic SDXL text-to-image and image-to-image classes."""
    assert available_families()["stable-diffusion-xl"] is FAMILY
    assert FAMILY.blocks_class is StableDiffusionXLAutoBlocks
    assert FAMILY.make_tiny_repo is make_tiny_repo
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
    ours = pipe(generator=torch.Generator("cpu").manual_seed(0), output="images", **kwargs)
    theirs = classic_from(sdxl_pipe, "text2image")(generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    assert torch.equal(ours, theirs.images)


def test_refiner_blocks_bind_to_refiner_repo(sdxl_refiner_repo):
    """The refiner blocks need only text_encoder_2 and read the repo's refiner config values."""
    pipe = StableDiffusionXLRefinerBlocks().init_pipeline(sdxl_refiner_repo)
    assert "text_encoder" not in pipe.component_names and "text_encoder_2" in pipe.component_names
    assert pipe.requires_aesthetics_score is True
    assert pipe.force_zeros_for_empty_prompt is False


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names both encoders, SDXL's inputs with their defaults, and both workflows."""
    doc = StableDiffusionXLAutoBlocks().doc
    for name in ("unet", "vae", "text_encoder", "text_encoder_2", "tokenizer_2", "scheduler"):
        assert f"    {name} (" in doc
    assert "guidance_scale (float, default: 5.0)" in doc
    assert "aesthetic_score (float, default: 6.0)" in doc
    assert "image2image: image, prompt" in doc
    assert "inpainting: mask_image, image, prompt" in doc


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
    "output_type": (
        {"prompt": "a cat", "output_type": "jpeg"},
        ValueError,
        "StableDiffusionXLCheckInputsStep: output_type ('jpeg') must be one of ['pil', 'np', 'pt', 'latent']; "
        "pass one of those",
    ),
    "strength": (
        {"prompt": "a cat", "image": make_image(), "strength": 1.5},
        ValueError,
        "StableDiffusionXLImg2ImgCheckInputsStep: strength (1.5) must be in [0, 1]; pass 0 to keep the image, "
        "1 to replace it, or a value between",
    ),
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
    "generators": (
        {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
        ValueError,
        "a list of generators needs one per image (got 3 for a batch of 1",
    ),
    "mask_without_image": (
        {"prompt": "a cat", "mask_image": make_mask()},
        MissingInputError,
        "block 'inpaint_vae_encoder' (StableDiffusionXLInpaintVaeEncoderStep) needs input 'image'",
    ),
    "image_type": ({"prompt": "a cat", "image": "cat.png"}, InputTypeError, "input 'image' must be"),
    "misspelled": ({"prompt": "a cat", "promt_2": "a dog"}, UnknownInputError, "did you mean 'prompt_2'?"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(sdxl_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    before = reference(sdxl_pipe)
    kwargs, error, message = BAD_CALLS[case]
    with pytest.raises(error) as info:
        sdxl_pipe(**{"num_inference_steps": STEPS, **kwargs})
    assert message in str(info.value)
    assert np.array_equal(reference(sdxl_pipe), before)


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
