"""The Flux.2 family: workflows, registration, loading, and bad input on the Flux.2 pipeline."""

import pytest
import torch

from blocks.flux2 import FAMILY, Flux2AutoBlocks, Flux2BeforeDenoiseStep, make_tiny_repo
from modular import InputTypeError, MissingInputError, ModularPipeline

from .. import helpers
from ..helpers import STEPS, workflow_steps
from .conftest import COMPONENTS, SIZE, make_image, run_both

PREPARE = ("prepare_latents", "set_timesteps", "prepare_guidance")


def test_workflows_select_the_expected_blocks():
    """Each named workflow runs the encoder, preparation and loop of its task, and nothing else."""
    expected = {
        "text2image": workflow_steps("check_inputs", prepare=PREPARE),
        "image_conditioned": workflow_steps("edit_check_inputs", ["edit_vae_encoder"], prepare=PREPARE),
    }
    chosen = {"image_conditioned": {"prompt": "a cat", "image": [make_image(), make_image(1)]}}
    helpers.assert_workflows(Flux2AutoBlocks(), expected, chosen)


def test_family_is_registered():
    """FAMILY is known by name, serves the classic Flux2Pipeline and names diffusers' Flux.2 LoRA loader."""
    helpers.assert_family(FAMILY, "flux2", Flux2AutoBlocks, make_tiny_repo)
    assert FAMILY.classic_pipelines == ("Flux2Pipeline",)
    assert FAMILY.lora_loader == "diffusers.loaders.Flux2LoraLoaderMixin"


def test_from_pretrained_on_the_classic_repo(flux2_repo):
    """from_pretrained maps a Flux2Pipeline model_index.json to our blocks, loading nothing."""
    helpers.assert_from_pretrained_loads_nothing((flux2_repo,), Flux2AutoBlocks, COMPONENTS, "transformer")


def test_pruned_workflow_pipeline_matches_classic(flux2_repo, flux2_pipe):
    """A pipeline of the image_conditioned workflow alone, loaded from the repo, gives the classic result."""
    pipe = ModularPipeline.from_pretrained(flux2_repo, workflow="image_conditioned")
    assert "image" in pipe.blocks.input_names
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": "a cat", "image": make_image(), "num_inference_steps": STEPS, "output_type": "latent"}
    ours, theirs = run_both(pipe, "image_conditioned", classic_on=flux2_pipe, **kwargs)
    assert torch.equal(ours, theirs)


def test_doc_lists_components_inputs_and_workflows():
    """The blocks' doc names every component, Flux.2's defaults and the two workflows."""
    helpers.assert_doc_names(
        Flux2AutoBlocks().doc,
        (*COMPONENTS, "image_processor"),
        "guidance_scale (float, default: 4.0)",
        "text_encoder_out_layers (tuple, default: (10, 20, 30))",
        "tokenizer (Any): The text encoder's processor or tokenizer",
        "image_conditioned: image, prompt",
    )


def test_output_types_and_default_size(flux2_pipe):
    """'pt' is the 'np' array as a [B, 3, H, W] tensor; without height and width the latents are 128 cells a side."""
    helpers.assert_pt_is_np_transposed(flux2_pipe, SIZE, height=SIZE, width=SIZE)
    preparation = Flux2BeforeDenoiseStep().init_pipeline()
    preparation.update_components(transformer=flux2_pipe.transformer, scheduler=flux2_pipe.scheduler)
    out = preparation(
        batch_size=1, num_inference_steps=STEPS, output=["latents", "latent_ids", "height", "width"]
    )
    assert (out["height"], out["width"]) == (1024, 1024)  # no VAE loaded: 8 pixels per latent cell
    assert out["latents"].shape == (1, 64 * 64, 16)
    assert out["latent_ids"][0, -1].tolist() == [0, 63, 63, 0]


BAD_CALLS = {
    "no_prompt": (
        {},
        ValueError,
        "Flux2TextEncoderStep: pass exactly one of prompt and prompt_embeds (got neither)",
    ),
    "empty_prompt_list": (
        {"prompt": []},
        ValueError,
        "Flux2CheckInputsStep: prompt ([]) is an empty list; pass a string or a list of at least one string",
    ),
    "height": (
        {"prompt": "a cat", "height": 2},
        ValueError,
        "Flux2CheckInputsStep: height (2) must be at least 4; pass 4 or more, or leave height unset",
    ),
    "latents_shape": (
        {"prompt": "a cat", "latents": torch.zeros(1, 16, 4, 4)},
        ValueError,
        "Flux2CheckInputsStep: latents (shape (1, 16, 4, 4)) must have shape (1, 16, 8, 8) for a batch of 1 "
        "(prompts x num_images_per_prompt) at 32x32 pixels; pass latents of that shape, or none",
    ),
    "output_type": (
        {"prompt": "a cat", "output_type": "jpeg"},
        ValueError,
        "Flux2CheckInputsStep: output_type ('jpeg') must be one of ['pil', 'np', 'pt', 'latent']; pass one of those",
    ),
    "generators": (
        {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
        ValueError,
        "a list of generators needs one per image (got 3 for a batch of 1",
    ),
    "out_layers": (
        {"prompt": "a cat", "text_encoder_out_layers": (10, 40)},
        ValueError,
        "Flux2TextEncoderStep: text_encoder_out_layers ((10, 40)) must name hidden states of the text encoder, "
        "0 (the embeddings) to 30; pass layers in that range",
    ),
    "small_image": (
        {"prompt": "a cat", "image": make_image(size=32)},
        ValueError,
        "Flux2EditCheckInputsStep: image (32x32) must be at least 64 pixels a side; pass a larger image",
    ),
    "thin_image": (
        {"prompt": "a cat", "image": [make_image(), make_image(size=64, height=640)]},
        ValueError,
        "Flux2EditCheckInputsStep: image[1] (64x640) must have an aspect ratio of at most 8:1; crop it",
    ),
    "image_type": (
        {"prompt": "a cat", "image": torch.zeros(1, 3, 64, 64)},
        InputTypeError,
        "input 'image' must be",
    ),
    "empty_image_list": (
        {"prompt": "a cat", "image": []},
        ValueError,
        "Flux2EditCheckInputsStep: image ([]) is an empty list; pass a PIL image or a list of at least one",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(flux2_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    call = {"num_inference_steps": STEPS, "height": SIZE, "width": SIZE, **kwargs}
    helpers.assert_refused_and_unchanged(flux2_pipe, call, error, message, height=SIZE, width=SIZE)


def test_bad_input_is_refused_before_any_model_runs(flux2_pipe):
    """A bad reference image is refused before the text encoder, the VAE or the transformer runs."""
    models = (flux2_pipe.text_encoder, flux2_pipe.vae, flux2_pipe.transformer)
    with helpers.forwards_of(*models) as calls, pytest.raises(ValueError):
        flux2_pipe(prompt="a cat", image=make_image(size=32), num_inference_steps=STEPS)
    assert calls == []


def test_image_conditioned_workflow_needs_an_image(flux2_repo, flux2_pipe):
    """The image_conditioned workflow's pipeline refuses to run without its image, naming the block and input."""
    pipe = ModularPipeline.from_pretrained(flux2_repo, workflow="image_conditioned")
    pipe.update_components(**{name: getattr(flux2_pipe, name) for name in COMPONENTS})
    with pytest.raises(MissingInputError) as info:
        pipe(prompt="a cat", num_inference_steps=STEPS)
    assert "(Flux2VaeEncoderStep) needs input 'image'" in str(info.value)


def test_unloaded_component_is_named(flux2_repo):
    """Calling before load_components names the first missing component and says to load it."""
    helpers.unloaded_component_error(Flux2AutoBlocks, flux2_repo)
