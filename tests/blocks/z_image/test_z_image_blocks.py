"""The Z-Image family: workflows, registration, loading, and bad input on the Z-Image pipeline."""

import json
import shutil

import numpy as np
import pytest
import torch

from blocks.z_image import FAMILY, ZImageAutoBlocks, ZImageBeforeDenoiseStep, make_tiny_repo
from modular import (
    ComponentNotLoadedError,
    InputTypeError,
    MissingInputError,
    ModularPipeline,
    available_families,
)

from .conftest import COMPONENTS, SIZE, classic_from, make_image

STEPS = 2


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    blocks = ZImageAutoBlocks()
    assert blocks.available_workflows == ["text2image", "image2image"]
    expected = {
        "text2image": [
            "check_inputs",
            "text_encoder",
            "input",
            "set_timesteps",
            "prepare_latents",
            "denoise",
            "decode",
        ],
        "image2image": [
            "img2img_check_inputs",
            "text_encoder",
            "input",
            "img2img_vae_encoder",
            "set_timesteps",
            "prepare_latents",
            "denoise",
            "decode",
        ],
    }
    for workflow, names in expected.items():
        assert list(blocks.get_workflow(workflow).sub_blocks) == names
    chosen = blocks.get_execution_blocks(prompt="a cat", image=make_image())
    assert list(chosen.sub_blocks) == expected["image2image"]


def test_family_is_registered():
    """FAMILY is known by name and serves the classic Z-Image text-to-image and image-to-image classes."""
    assert available_families()["z-image"] is FAMILY
    assert FAMILY.blocks_class is ZImageAutoBlocks
    assert FAMILY.make_tiny_repo is make_tiny_repo
    assert set(FAMILY.classic_pipelines) == {"ZImagePipeline", "ZImageImg2ImgPipeline"}


def test_from_pretrained_on_classic_repos(zimage_repo, tmp_path):
    """from_pretrained maps a ZImagePipeline or ZImageImg2ImgPipeline model_index.json to our blocks, loading nothing."""
    img2img_repo = tmp_path / "img2img"
    shutil.copytree(zimage_repo, img2img_repo)
    index = json.loads((img2img_repo / "model_index.json").read_text())
    index["_class_name"] = "ZImageImg2ImgPipeline"
    (img2img_repo / "model_index.json").write_text(json.dumps(index))
    for repo in (zimage_repo, img2img_repo):
        pipe = ModularPipeline.from_pretrained(repo)
        assert isinstance(pipe.blocks, ZImageAutoBlocks)
        assert set(pipe.null_component_names) == set(COMPONENTS)
        assert pipe.get_component_spec("transformer").load_id == f"{repo}|transformer|null|null"


def test_pruned_workflow_pipeline_matches_classic(zimage_repo, zimage_pipe):
    """A pipeline of the image2image workflow alone, loaded from the repo, gives the classic img2img result."""
    pipe = ModularPipeline.from_pretrained(zimage_repo, workflow="image2image")
    assert "image" in pipe.blocks.input_names
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "image": make_image(), "num_inference_steps": 3, "output_type": "latent"}
    ours = pipe(generator=torch.Generator("cpu").manual_seed(0), output="images", **kwargs)
    theirs = classic_from(zimage_pipe, "image2image")(
        generator=torch.Generator("cpu").manual_seed(0), **kwargs
    ).images
    assert torch.equal(ours, theirs)


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, Z-Image's defaults and the two workflows."""
    doc = ZImageAutoBlocks().doc
    for name in (*COMPONENTS, "image_processor"):
        assert f"    {name} (" in doc
    assert "guidance_scale (float, default: 5.0)" in doc
    assert "strength (float, default: 0.6)" in doc
    assert "image2image: image, prompt" in doc


def test_output_types_and_default_size(zimage_pipe):
    """'pt' is the 'np' array as a [B, 3, H, W] tensor; without height and width the latents are 1024 px worth."""
    kwargs = {
        "prompt": "a cat",
        "num_inference_steps": STEPS,
        "height": SIZE,
        "width": SIZE,
        "output": "images",
    }
    as_pt = zimage_pipe(output_type="pt", generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    as_np = zimage_pipe(output_type="np", generator=torch.Generator("cpu").manual_seed(0), **kwargs)
    assert as_pt.shape == (1, 3, SIZE, SIZE)
    assert 0 <= as_pt.min() and as_pt.max() <= 1
    assert torch.equal(as_pt.permute(0, 2, 3, 1), torch.from_numpy(as_np))
    preparation = ZImageBeforeDenoiseStep().init_pipeline()
    preparation.update_components(transformer=zimage_pipe.transformer, scheduler=zimage_pipe.scheduler)
    out = preparation(batch_size=1, num_inference_steps=STEPS, output=["latents", "height", "width"])
    assert (out["height"], out["width"]) == (1024, 1024)
    assert out["latents"].shape == (1, 16, 128, 128)  # no VAE loaded: Z-Image's 8 pixels per latent cell


def reference(pipe):
    """A fixed small call, to check that a failed call left the pipeline working as before."""
    return pipe(
        prompt="a cat",
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        output="images",
    )


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
    "output_type": (
        {"prompt": "a cat", "output_type": "jpeg"},
        ValueError,
        "ZImageCheckInputsStep: output_type ('jpeg') must be one of ['pil', 'np', 'pt', 'latent']; pass one of those",
    ),
    "strength": (
        {"prompt": "a cat", "image": make_image(), "strength": 1.5},
        ValueError,
        "ZImageImg2ImgCheckInputsStep: strength (1.5) must be in [0, 1]; pass 0 to keep the image, 1 to replace "
        "it, or a value between",
    ),
    "no_steps_left": (
        {"prompt": "a cat", "image": make_image(), "strength": 0.0},
        ValueError,
        "ZImageImg2ImgCheckInputsStep: strength (0.0) with num_inference_steps (2) leaves 0 denoising steps; "
        "raise strength or num_inference_steps",
    ),
    "image_size": (
        {"prompt": "a cat", "image": make_image(), "height": 48},
        ValueError,
        "ZImageImg2ImgCheckInputsStep: height (48) must be the image's height (32, a multiple of 4): the image is "
        "not resized; leave height and width unset to use the image's size, or resize the image",
    ),
    "generators": (
        {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
        ValueError,
        "a list of generators needs one per image (got 3 for a batch of 1",
    ),
    "image_type": ({"prompt": "a cat", "image": "cat.png"}, InputTypeError, "input 'image' must be"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(zimage_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    before = reference(zimage_pipe)
    kwargs, error, message = BAD_CALLS[case]
    # Image-to-image takes its size from the image unless told.
    size = {} if "image" in kwargs else {"height": SIZE, "width": SIZE}
    kwargs = {"num_inference_steps": STEPS, **size, **kwargs}
    with pytest.raises(error) as info:
        zimage_pipe(**kwargs)
    assert message in str(info.value)
    assert np.array_equal(reference(zimage_pipe), before)


def test_image2image_workflow_needs_an_image(zimage_repo, zimage_pipe):
    """The image2image workflow's pipeline refuses to run without its image, naming the block and input."""
    pipe = ModularPipeline.from_pretrained(zimage_repo, workflow="image2image")
    pipe.update_components(**{name: getattr(zimage_pipe, name) for name in COMPONENTS})
    with pytest.raises(MissingInputError) as info:
        pipe(prompt="a cat", num_inference_steps=STEPS)
    assert "block 'img2img_vae_encoder' (ZImageVaeEncoderStep) needs input 'image'" in str(info.value)


def test_unloaded_component_is_named(zimage_repo):
    """Calling before load_components names the first missing component and says to load it."""
    pipe = ZImageAutoBlocks().init_pipeline(zimage_repo)
    with pytest.raises(ComponentNotLoadedError) as info:
        pipe(prompt="a cat")
    assert "needs component 'text_encoder', which is not loaded" in str(info.value)
