"""The Flux family: workflows, registration, shared components, and bad input on the Flux pipelines."""

import numpy as np
import pytest
import torch

from blocks.flux import FAMILY, FluxAutoBlocks, make_tiny_repo
from modular import (
    ComponentsManager,
    InputTypeError,
    MissingInputError,
    ModularPipeline,
    UnknownInputError,
    available_families,
)

from .conftest import COMPONENTS, classic_from, make_image

STEPS = 2
SIZE = {"height": 32, "width": 32}


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and the inputs choose it."""
    blocks = FluxAutoBlocks()
    assert blocks.available_workflows == ["text2image", "image2image", "control"]
    common = ["text_encoder", "input"]
    prepare = ["prepare_latents", "set_timesteps", "prepare_guidance"]
    expected = {
        "text2image": ["check_inputs", *common, *prepare, "denoise", "decode"],
        "image2image": [
            "img2img_check_inputs",
            *common,
            "img2img_vae_encoder",
            "set_timesteps",
            "prepare_latents",
            "prepare_guidance",
        ]
        + ["denoise", "decode"],
        "control": [
            "control_check_inputs",
            *common,
            "control_image_encoder",
            *prepare,
            "control_denoise",
            "decode",
        ],
    }
    for workflow, names in expected.items():
        assert list(blocks.get_workflow(workflow).sub_blocks) == names
    chosen = {
        "text2image": blocks.get_execution_blocks(prompt="a cat"),
        "image2image": blocks.get_execution_blocks(prompt="a cat", image=make_image()),
        "control": blocks.get_execution_blocks(prompt="a cat", control_image=make_image()),
    }
    for workflow, execution in chosen.items():
        assert list(execution.sub_blocks) == expected[workflow]


def test_family_is_known():
    """FAMILY is known by name and serves the three classic Flux pipeline classes."""
    assert available_families()["flux"] is FAMILY
    assert FAMILY.blocks_class is FluxAutoBlocks
    assert FAMILY.make_tiny_repo is make_tiny_repo
    assert FAMILY.classic_pipelines == ("FluxPipeline", "FluxImg2ImgPipeline", "FluxControlPipeline")


def test_from_pretrained_on_classic_repos(flux_repo, flux_control_repo):
    """from_pretrained maps a FluxPipeline or FluxControlPipeline index to the Flux blocks, loading nothing."""
    for repo in (flux_repo, flux_control_repo):
        pipe = ModularPipeline.from_pretrained(repo)
        assert isinstance(pipe.blocks, FluxAutoBlocks)
        assert set(pipe.null_component_names) == set(COMPONENTS)
        assert pipe.get_component_spec("transformer").load_id == f"{repo}|transformer|null|null"


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, Flux's inputs with defaults, and the three workflows."""
    doc = FluxAutoBlocks().doc
    for name in (*COMPONENTS, "image_processor"):
        assert f"    {name} (" in doc
    assert "num_inference_steps (int, default: 28)" in doc
    assert "max_sequence_length (int, default: 512)" in doc
    assert "control: control_image, prompt" in doc


def test_three_workflows_share_encoders_and_vae(flux_repo, flux_control_repo, flux_pipe):
    """As in the seed scenario: text2img and control pipelines share the encoders and VAE through a manager,
    each control pipeline loads only its transformer, and the results equal the classic pipelines'."""
    cm = ComponentsManager()
    base = ModularPipeline.from_pretrained(flux_repo, components_manager=cm)
    base.load_components(torch_dtype=torch.float32)
    shared = {name: getattr(base, name) for name in COMPONENTS if name != "transformer"}
    control = ModularPipeline.from_pretrained(flux_control_repo, components_manager=cm, workflow="control")
    control.update_components(**shared)
    control.load_components(["transformer"], torch_dtype=torch.float32)
    assert control.vae is base.vae and control.text_encoder_2 is base.text_encoder_2
    assert control.transformer is not base.transformer
    assert control.transformer.config.in_channels == 2 * base.transformer.config.in_channels
    for pipe, workflow, extra in (
        (base, "text2image", {}),
        (control, "control", {"control_image": make_image(1)}),
    ):
        pipe.set_progress_bar_config(disable=True)
        kwargs = {**SIZE, "prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **extra}
        ours = pipe(generator=torch.Generator("cpu").manual_seed(0), output="images", **kwargs)
        theirs = classic_from(pipe, workflow)(
            generator=torch.Generator("cpu").manual_seed(0), **kwargs
        ).images
        assert torch.equal(ours, theirs)


def test_control_workflow_needs_control_image(flux_control_repo, flux_control_pipe):
    """A pipeline of the control workflow alone refuses a call without control_image, naming the block."""
    pipe = ModularPipeline.from_pretrained(flux_control_repo, workflow="control")
    pipe.update_components(**{name: getattr(flux_control_pipe, name) for name in COMPONENTS})
    with pytest.raises(MissingInputError) as info:
        pipe(prompt="a cat", num_inference_steps=STEPS, **SIZE)
    assert "needs input 'control_image'" in str(info.value)
    assert "control_image_encoder" in str(info.value)


def reference(pipe, **extra):
    """A fixed small call, to check that a failed call left the pipeline working as before."""
    kwargs = {**SIZE, "num_inference_steps": STEPS, "output_type": "np", "output": "images", **extra}
    return pipe(prompt="a cat", generator=torch.Generator("cpu").manual_seed(0), **kwargs)


ENCODER = "FluxTextEncoderStep: "
BAD_CALLS = {
    "prompt_and_embeds": (
        {
            "prompt": "a cat",
            "prompt_embeds": torch.zeros(1, 8, 32),
            "pooled_prompt_embeds": torch.zeros(1, 32),
        },
        ValueError,
        ENCODER + "pass exactly one of prompt and prompt_embeds (got both)",
    ),
    "no_prompt": ({}, ValueError, ENCODER + "pass exactly one of prompt and prompt_embeds (got neither)"),
    "embeds_without_pooled": (
        {"prompt_embeds": torch.zeros(1, 8, 32)},
        ValueError,
        ENCODER + "prompt_embeds need pooled_prompt_embeds from the same CLIP encoder",
    ),
    "sequence_length": (
        {"prompt": "a cat", "max_sequence_length": 600},
        ValueError,
        ENCODER + "max_sequence_length must be at most 512 (got 600)",
    ),
    "negative_type": (
        {"prompt": ["a cat"], "negative_prompt": "blurry", "true_cfg_scale": 2.0},
        TypeError,
        "FluxCheckInputsStep: negative_prompt (a str) must have the type of prompt (a list); "
        "pass both as str or both as list",
    ),
    "negative_count": (
        {"prompt": ["a cat", "a dog"], "negative_prompt": ["blurry"], "true_cfg_scale": 2.0},
        ValueError,
        "FluxCheckInputsStep: negative_prompt has 1 entry for 2 prompts; pass one per prompt",
    ),
    "output_type": (
        {"prompt": "a cat", "output_type": "jpeg"},
        ValueError,
        "FluxCheckInputsStep: output_type ('jpeg') must be one of ['pil', 'np', 'pt', 'latent']; pass one of those",
    ),
    "strength": (
        {"prompt": "a cat", "image": make_image(), "strength": 1.5},
        ValueError,
        "FluxImg2ImgCheckInputsStep: strength (1.5) must be in [0, 1]; pass 0 to keep the image, 1 to replace it, "
        "or a value between",
    ),
    "no_steps_left": (
        {"prompt": "a cat", "image": make_image(), "strength": 0.0},
        ValueError,
        "FluxImg2ImgCheckInputsStep: strength (0.0) with num_inference_steps (2) leaves 0 denoising steps; "
        "raise strength or num_inference_steps",
    ),
    "generators": (
        {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
        ValueError,
        "FluxPrepareLatentsStep: a list of generators needs one per image (got 3 for a batch of 1",
    ),
    "control_image_on_plain_transformer": (
        {"prompt": "a cat", "control_image": make_image()},
        ValueError,
        "FluxControlCheckInputsStep: the transformer takes 16 input channels for 16 output channels, "
        "not a control transformer; load a control transformer",
    ),
    "image_type": ({"prompt": "a cat", "image": "cat.png"}, InputTypeError, "input 'image' must be"),
    "misspelled": ({"promt": "a cat"}, UnknownInputError, "did you mean 'prompt'?"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(flux_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    before = reference(flux_pipe)
    kwargs, error, message = BAD_CALLS[case]
    with pytest.raises(error) as info:
        flux_pipe(**{**SIZE, "num_inference_steps": STEPS, **kwargs})
    assert message in str(info.value)
    assert np.array_equal(reference(flux_pipe), before)


CONTROL_BAD_CALLS = {
    "no_control_image": (
        {"prompt": "a cat"},
        "FluxCheckInputsStep: the transformer takes 32 input channels for 16 output channels, "
        "a control transformer; pass control_image",
    ),
    "control_image_count": (
        {"prompt": ["a cat", "a dog"], "control_image": [make_image(1), make_image(2), make_image(3)]},
        "FluxControlCheckInputsStep: control_image holds 3 images for 2 prompts; pass 1 control image or one per "
        "prompt",
    ),
}


@pytest.mark.parametrize("case", list(CONTROL_BAD_CALLS))
def test_bad_control_input(flux_control_pipe, case):
    """A control transformer without a control image, or a wrong count of control images, is refused clearly."""
    control_image = make_image(1)
    before = reference(flux_control_pipe, control_image=control_image)
    kwargs, message = CONTROL_BAD_CALLS[case]
    with pytest.raises(ValueError) as info:
        flux_control_pipe(**{**SIZE, "num_inference_steps": STEPS, **kwargs})
    assert message in str(info.value)
    assert np.array_equal(reference(flux_control_pipe, control_image=control_image), before)


def test_output_types(flux_pipe):
    """output_type 'pt' gives a [B, 3, H, W] tensor in [0, 1] equal to the 'np' array transposed."""
    as_pt = reference(flux_pipe, output_type="pt")
    as_np = reference(flux_pipe, output_type="np")
    assert as_pt.shape == (1, 3, 32, 32)
    assert 0 <= as_pt.min() and as_pt.max() <= 1
    assert torch.equal(as_pt.permute(0, 2, 3, 1), torch.from_numpy(as_np))
