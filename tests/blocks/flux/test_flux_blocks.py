"""The Flux family: workflows, registration, shared components, and bad input on the Flux pipelines."""

import pytest
import torch

from blocks.flux import FAMILY, FluxAutoBlocks, make_tiny_repo
from modular import ComponentsManager, MissingInputError, ModularPipeline, UnknownInputError

from .. import helpers
from ..helpers import STEPS, workflow_steps
from .conftest import COMPONENTS, make_image, run_both

SIZE = {"height": 32, "width": 32}


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and the inputs choose it."""
    prepare = ["prepare_latents", "set_timesteps", "prepare_guidance"]
    img2img_prepare = ["set_timesteps", "prepare_latents", "prepare_guidance"]
    expected = {
        "text2image": workflow_steps("check_inputs", prepare=prepare),
        "image2image": workflow_steps("img2img_check_inputs", ["img2img_vae_encoder"], img2img_prepare),
        "control": workflow_steps(
            "control_check_inputs", ["control_image_encoder"], prepare, "control_denoise"
        ),
    }
    chosen = {
        "text2image": {"prompt": "a cat"},
        "image2image": {"prompt": "a cat", "image": make_image()},
        "control": {"prompt": "a cat", "control_image": make_image()},
    }
    helpers.assert_workflows(FluxAutoBlocks(), expected, chosen)


def test_family_is_known():
    """FAMILY is known by name and serves the three classic Flux pipeline classes."""
    helpers.assert_family(FAMILY, "flux", FluxAutoBlocks, make_tiny_repo)
    assert FAMILY.classic_pipelines == ("FluxPipeline", "FluxImg2ImgPipeline", "FluxControlPipeline")


def test_from_pretrained_on_classic_repos(flux_repo, flux_control_repo):
    """from_pretrained maps a FluxPipeline or FluxControlPipeline index to the Flux blocks, loading nothing."""
    repos = (flux_repo, flux_control_repo)
    helpers.assert_from_pretrained_loads_nothing(repos, FluxAutoBlocks, COMPONENTS, "transformer")


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, Flux's inputs with defaults, and the three workflows."""
    helpers.assert_doc_names(
        FluxAutoBlocks().doc,
        (*COMPONENTS, "image_processor"),
        "num_inference_steps (int, default: 28)",
        "max_sequence_length (int, default: 512)",
        "control: control_image, prompt",
    )


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
        ours, theirs = run_both(pipe, workflow, **kwargs)
        assert torch.equal(ours, theirs)


def test_control_workflow_needs_control_image(flux_control_repo, flux_control_pipe):
    """A pipeline of the control workflow alone refuses a call without control_image, naming the block."""
    pipe = ModularPipeline.from_pretrained(flux_control_repo, workflow="control")
    pipe.update_components(**{name: getattr(flux_control_pipe, name) for name in COMPONENTS})
    with pytest.raises(MissingInputError) as info:
        pipe(prompt="a cat", num_inference_steps=STEPS, **SIZE)
    assert "needs input 'control_image'" in str(info.value)
    assert "control_image_encoder" in str(info.value)


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
    **helpers.common_bad_calls("Flux", image=make_image(), no_steps_strength=0.0),
    # Replaces the common case with a longer message: Flux's names the step.
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
    "misspelled": ({"promt": "a cat"}, UnknownInputError, "did you mean 'prompt'?"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(flux_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    call = {**SIZE, "num_inference_steps": STEPS, **kwargs}
    helpers.assert_refused_and_unchanged(flux_pipe, call, error, message, **SIZE)


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
    kwargs, message = CONTROL_BAD_CALLS[case]
    call = {**SIZE, "num_inference_steps": STEPS, **kwargs}
    reference = {**SIZE, "control_image": make_image(1)}
    helpers.assert_refused_and_unchanged(flux_control_pipe, call, ValueError, message, **reference)


def test_output_types(flux_pipe):
    """output_type 'pt' gives a [B, 3, H, W] tensor in [0, 1] equal to the 'np' array transposed."""
    helpers.assert_pt_is_np_transposed(flux_pipe, 32, **SIZE)
