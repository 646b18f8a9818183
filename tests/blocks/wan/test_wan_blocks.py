"""The Wan family: workflows, registration, the blocks each repo layout gets, the experts, and bad input."""

import json
import shutil

import numpy as np
import pytest
import torch

from blocks.wan import (
    FAMILY,
    Wan22Blocks,
    Wan22Image2VideoBlocks,
    WanBlocks,
    WanImage2VideoAutoBlocks,
    make_tiny_repo,
)
from modular import (
    ComponentNotLoadedError,
    ComponentsManager,
    InputTypeError,
    MissingInputError,
    ModularPipeline,
)

from .. import helpers
from ..helpers import STEPS, seeded
from .conftest import VIDEO, make_image

TEXT2VIDEO_STEPS = [
    "check_inputs",
    "text_encoder",
    "input",
    "set_timesteps",
    "prepare_latents",
    "denoise",
    "decode",
]
IMAGE2VIDEO_STEPS = [
    "check_inputs",
    "text_encoder",
    "image_encoder",
    "input",
    "set_timesteps",
    "prepare_latents",
    "denoise",
    "decode",
]


def test_workflows_select_the_expected_blocks():
    """Each blocks class offers its one workflow and runs exactly its steps."""
    helpers.assert_workflows(
        WanBlocks(), {"text2video": TEXT2VIDEO_STEPS}, {"text2video": {"prompt": "a cat"}}
    )
    helpers.assert_workflows(
        Wan22Image2VideoBlocks(),
        {"image2video": IMAGE2VIDEO_STEPS},
        {"image2video": {"prompt": "a cat", "image": make_image()}},
    )


def test_family_is_registered():
    """FAMILY is known as 'wan', serves both classic pipelines, and names the peer's class per blocks class."""
    helpers.assert_family(FAMILY, "wan", Wan22Blocks, make_tiny_repo)
    assert FAMILY.classic_pipelines == ("WanPipeline", "WanImageToVideoPipeline")
    assert [FAMILY.peer_pipeline_class_for(cls.__name__) for cls in FAMILY.all_blocks_classes] == [
        "Wan22ModularPipeline",
        "WanModularPipeline",
        "WanImage2VideoModularPipeline",
        "Wan22Image2VideoModularPipeline",
    ]


@pytest.mark.parametrize(
    ("kind", "blocks_class", "absent"),
    [
        ("wan2.1", WanBlocks, ["transformer_2"]),
        ("wan2.2", Wan22Blocks, []),
        ("wan2.1-i2v", WanImage2VideoAutoBlocks, ["transformer_2"]),
        ("wan2.2-i2v", Wan22Image2VideoBlocks, ["image_encoder", "image_processor"]),
    ],
)
def test_each_repo_layout_gets_its_blocks_and_absent_components(request, kind, blocks_class, absent):
    """from_pretrained picks the blocks by pipeline class and boundary_ratio, records the [null, null] entries as
    absent, and loads nothing."""
    repo = request.getfixturevalue(f"{kind.replace('.', '').replace('-', '_')}_repo")
    pipe = ModularPipeline.from_pretrained(repo)
    assert type(pipe.blocks) is blocks_class
    assert pipe.absent_component_names == absent
    assert set(pipe.null_component_names) == {*pipe.pretrained_component_names}
    assert pipe.get_component_spec("transformer").load_id == f"{repo}|transformer|null|null"


def _plans(pipe, cm, monkeypatch, **inputs):
    seen = []
    monkeypatch.setattr(cm, "set_execution_plan", lambda objs: seen.append(list(objs)))
    pipe(prompt="a cat", generator=seeded(0), num_inference_steps=STEPS, output="videos", **VIDEO, **inputs)
    return seen[0]


def test_the_plan_lists_the_experts_and_leaves_absent_components_out(wan21_repo, wan22_i2v_repo, monkeypatch):
    """Wan 2.1 plans text encoder, transformer, VAE (no transformer_2); Wan 2.2 image-to-video plans no image
    encoder, the VAE first for the image, then the loop's experts (its own, then its body's) and the VAE."""
    cm = ComponentsManager()
    one = ModularPipeline.from_pretrained(wan21_repo, components_manager=cm)
    one.load_components(torch_dtype=torch.float32)
    assert _plans(one, cm, monkeypatch) == [one.text_encoder, one.transformer, one.vae]
    two = ModularPipeline.from_pretrained(wan22_i2v_repo, components_manager=cm)
    two.load_components(torch_dtype=torch.float32)
    plan = _plans(two, cm, monkeypatch, image=make_image())
    experts = [two.transformer, two.transformer_2]
    assert plan == [two.text_encoder, two.vae, *experts, *experts, two.vae]


def test_the_experts_take_the_steps_on_their_side_of_the_boundary(wan22_pipe):
    """With boundary 0.875 and timesteps [999, 750, ...]: transformer takes t >= 875, transformer_2 the rest,
    twice per step (conditional and unconditional)."""
    wan22_pipe.scheduler.set_timesteps(4)
    timesteps = wan22_pipe.scheduler.timesteps.tolist()
    high = sum(t >= 875 for t in timesteps)
    with (
        helpers.forwards_of(wan22_pipe.transformer) as first,
        helpers.forwards_of(wan22_pipe.transformer_2) as second,
    ):
        wan22_pipe(prompt="a cat", generator=seeded(0), num_inference_steps=4, output="videos", **VIDEO)
    assert (len(first), len(second)) == (2 * high, 2 * (4 - high)) and 0 < high < 4


def test_a_two_expert_repo_without_transformer_2_loaded_is_refused(wan22_repo):
    """transformer_2 not loaded (not absent: the repo has one) is an error before any model runs."""
    pipe = ModularPipeline.from_pretrained(wan22_repo)
    pipe.load_components([name for name in pipe.pretrained_component_names if name != "transformer_2"])
    with pytest.raises(ComponentNotLoadedError, match="needs component 'transformer_2', which is not loaded"):
        pipe(prompt="a cat", **VIDEO)


def test_boundary_ratio_without_transformer_2_says_how_to_fix(wan21_pipe):
    """A boundary_ratio set on a one-transformer repo fails at the first low-noise step, naming both fixes."""
    wan21_pipe.update_components(boundary_ratio=0.875)
    try:
        with pytest.raises(
            ValueError, match=r"hands the low-noise timesteps to transformer_2, which this pipeline"
        ):
            wan21_pipe(prompt="a cat", num_inference_steps=STEPS, **VIDEO)
    finally:
        wan21_pipe.update_components(boundary_ratio=None)


def test_doc_lists_components_inputs_and_the_workflow():
    """The blocks' doc names every component, Wan's inputs and defaults, and the workflow."""
    doc = Wan22Image2VideoBlocks().doc
    components = ("text_encoder", "tokenizer", "transformer", "transformer_2", "vae", "scheduler", "guider")
    helpers.assert_doc_names(
        doc,
        (*components, "image_encoder", "image_processor", "video_processor"),
        "num_frames (int, default: 81)",
        "guidance_scale_2 (float",
        "image2video: image, prompt",
    )


def _reference(pipe, **inputs):
    return pipe(
        prompt="a cat", generator=seeded(0), num_inference_steps=STEPS, output="videos", **VIDEO, **inputs
    )


BAD_CALLS = {
    "no_prompt": ({}, ValueError, "WanCheckInputsStep: pass prompt (or prompt_embeds)"),
    "prompt_and_embeds": (
        {"prompt": "a cat", "prompt_embeds": torch.zeros(1, 8, 32)},
        ValueError,
        "WanCheckInputsStep: pass prompt or prompt_embeds, not both",
    ),
    "negative_count": (
        {"prompt": ["a cat", "a dog"], "negative_prompt": ["blurry"]},
        ValueError,
        "WanCheckInputsStep: negative_prompt has 1 entries for 2 prompts; pass one per prompt, or a single string",
    ),
    "height": (
        {"prompt": "a cat", "height": 30},
        ValueError,
        "WanCheckInputsStep: height (30) must be divisible by 16; pass a multiple of 16 such as 16 or 32",
    ),
    "frames": ({"prompt": "a cat", "num_frames": 0}, ValueError, "num_frames (0) must be at least 1"),
    "output_type": (
        {"prompt": "a cat", "output_type": "mp4"},
        ValueError,
        "WanCheckInputsStep: output_type ('mp4') must be one of ['pil', 'np', 'pt', 'latent']; pass one of those",
    ),
    "prompt_type": ({"prompt": 3}, InputTypeError, "input 'prompt' must be"),
    "generators": (
        {"prompt": "a cat", "generator": [torch.Generator("cpu")] * 3},
        ValueError,
        "WanPrepareLatentsStep: a list of generators needs one per image (got 3 for a batch of 1",
    ),
    "two_problems": (
        {"prompt": "a cat", "height": 30, "num_inference_steps": 0},
        ValueError,
        "WanCheckInputsStep: 2 problems with the inputs:\n  - num_inference_steps (0) must be at least 1",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_and_leaves_pipeline_working(wan22_pipe, case):
    """Each bad call raises a clear error naming the block or input, and the next good call is unchanged."""
    kwargs, error, message = BAD_CALLS[case]
    before = _reference(wan22_pipe)
    with pytest.raises(error) as info:
        wan22_pipe(**{"num_inference_steps": STEPS, **VIDEO, **kwargs})
    assert message in str(info.value)
    assert np.array_equal(_reference(wan22_pipe), before)


def test_guidance_scale_2_on_one_transformer_is_refused(wan21_pipe):
    """guidance_scale_2 names the low-noise expert, which a Wan 2.1 repo has not: refused before any model runs."""
    with helpers.forwards_of(wan21_pipe.text_encoder) as calls, pytest.raises(ValueError) as info:
        wan21_pipe(prompt="a cat", guidance_scale_2=3.0, **VIDEO)
    assert str(info.value) == (
        "WanCheckInputsStep: guidance_scale_2 is the low-noise expert's scale, and this repo has one expert (no "
        "boundary_ratio); leave guidance_scale_2 unset"
    )
    assert calls == []


def test_image2video_needs_an_image_of_a_known_kind(wan22_i2v_pipe):
    """Without an image the call names the block and input; a path string is refused as the wrong type."""
    with pytest.raises(MissingInputError, match="needs input 'image'"):
        wan22_i2v_pipe(prompt="a cat", **VIDEO)
    with pytest.raises(InputTypeError, match="input 'image' must be"):
        wan22_i2v_pipe(prompt="a cat", image="cat.png", **VIDEO)


def test_image_embeds_on_a_two_expert_repo_are_refused(wan22_i2v_pipe):
    """image_embeds are Wan 2.1's; a Wan 2.2 repo's transformers read none: refused, naming the repo's kind."""
    with pytest.raises(
        ValueError, match="image_embeds are for Wan 2.1 image-to-video; this repo has a boundary_ratio"
    ):
        wan22_i2v_pipe(prompt="a cat", image=make_image(), image_embeds=torch.zeros(1, 4, 4), **VIDEO)


def test_unloaded_component_is_named(wan22_repo):
    """Calling before load_components names the first missing component and says to load it."""
    pipe = ModularPipeline.from_pretrained(wan22_repo)
    with pytest.raises(ComponentNotLoadedError, match="needs component 'text_encoder', which is not loaded"):
        pipe(prompt="a cat")


def test_a_wan21_repo_that_predates_transformer_2_runs_with_one_transformer(wan21_repo, wan21_pipe, tmp_path):
    """The published Wan 2.1 repos' model_index.json lists no transformer_2 at all: absent as a [null, null]
    entry is, and the video equals the one of the repo that lists it."""
    older = tmp_path / "older"
    shutil.copytree(wan21_repo, older)
    index = json.loads((older / "model_index.json").read_text())
    del index["transformer_2"], index["boundary_ratio"], index["expand_timesteps"]
    (older / "model_index.json").write_text(json.dumps(index))
    pipe = ModularPipeline.from_pretrained(older)
    assert type(pipe.blocks) is WanBlocks
    assert pipe.absent_component_names == ["transformer_2"]
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    assert np.array_equal(_reference(pipe), _reference(wan21_pipe))
