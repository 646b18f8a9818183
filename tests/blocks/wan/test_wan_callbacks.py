"""Step callbacks on both Wan workflows: the classic pipelines' tensors (latents, prompt_embeds,
negative_prompt_embeds), replacements taken back, the interrupt flag and a guidance cutoff, bit for bit equal to
the classic Wan pipelines given the same callback."""

import pytest
import torch

from ..callback_recording import CLASSIC, OURS, RecordingCallback, assert_same_calls
from ..helpers import assert_identical, seeded
from .conftest import VIDEO, classic_from, make_image, run_both

STEPS = 3  # so that a change at step 1 has a step before and after it
NAMES = ["latents", "prompt_embeds", "negative_prompt_embeds"]  # WanPipeline._callback_tensor_inputs
WORKFLOWS = {"wan2.2": ("text2video", {}), "wan2.2-i2v": ("image2video", {"image": make_image()})}


@pytest.fixture(params=list(WORKFLOWS))
def case(request):
    """Each workflow: its pipeline (two experts), name and inputs."""
    kind = request.param
    workflow, inputs = WORKFLOWS[kind]
    return request.getfixturevalue(f"{kind.replace('.', '').replace('-', '_')}_pipe"), workflow, inputs


def both(case, callback, **inputs):
    """Ours and the classic pipeline's latents with `callback`, asking for every tensor the classic offers."""
    pipe, workflow, own = case
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **own, **inputs}
    return run_both(
        pipe, workflow, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=NAMES, **kwargs
    )


def ours_plain(case, **inputs):
    """Our latents without a callback."""
    pipe, _, own = case
    kwargs = {
        "prompt": "a cat",
        "num_inference_steps": STEPS,
        "output_type": "latent",
        **VIDEO,
        **own,
        **inputs,
    }
    return pipe(generator=seeded(0), output="videos", **kwargs)


def test_the_workflows_offer_the_classic_tensor_names(case):
    """The pipeline offers what the classic pipeline's _callback_tensor_inputs lists."""
    pipe, workflow, _ = case
    assert pipe.callback_tensor_inputs == NAMES == classic_from(pipe, workflow)._callback_tensor_inputs


def test_the_callback_gets_the_classic_tensors_at_the_classic_steps(case):
    """At every step both pipelines hand the callback the same step index, timestep and tensors ([B, C, F, H, W]
    latents, [B, seq_len, dim] embeddings), and the outputs are equal."""
    callback = RecordingCallback()
    ours, theirs = both(case, callback, prompt=["a cat", "a dog"], num_videos_per_prompt=2)
    assert_identical(ours, theirs)
    assert_same_calls(callback, NAMES, STEPS)
    values = callback.calls[OURS][0].values
    assert values["latents"].shape == (4, 16, 2, 4, 4)
    assert values["prompt_embeds"].shape == values["negative_prompt_embeds"].shape == (4, 512, 32)


@pytest.mark.parametrize("name", ["latents", "prompt_embeds", "negative_prompt_embeds"])
def test_a_tensor_changed_at_one_step_equals_the_classic(case, name):
    """A tensor a callback replaces at step 1 is what steps 2 and on read, as in the classic pipeline."""
    callback = RecordingCallback(changes={1: lambda given: {name: given[name] * 0.5}})
    ours, theirs = both(case, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(case))


def test_interrupt_at_step_1_returns_what_the_classic_returns(case):
    """A callback that sets pipeline._interrupt at step 1 ends the loop after it, as in the classic pipeline."""
    callback = RecordingCallback(sets={1: {"_interrupt": True}})
    ours, theirs = both(case, callback, output_type="np")
    assert_identical(ours, theirs)
    assert callback.step_indexes == {CLASSIC: [0, 1], OURS: [0, 1]}


def test_a_guidance_cutoff_by_a_callback_equals_the_classic(case):
    """pipeline._guidance_scale set to 0 at step 0 (diffusers' CFG cutoff callbacks) turns guidance off for the
    remaining steps of both experts, as in the classic pipeline."""
    callback = RecordingCallback(sets={0: {"_guidance_scale": 0.0}})
    ours, theirs = both(case, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(case))
