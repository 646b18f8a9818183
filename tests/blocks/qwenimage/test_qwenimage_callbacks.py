"""Step callbacks on both Qwen-Image workflows: the classic pipelines' tensors (packed latents, prompt_embeds) in
their layout, replacements taken back, and the interrupt flag, bit for bit equal to the classic pipelines given
the same callback."""

import pytest
import torch

from ..callback_recording import CLASSIC, OURS, RecordingCallback, assert_same_calls
from ..helpers import assert_identical, seeded
from .conftest import SIZE, classic_from, edit_classic_from, make_image, run_both, run_both_edit

STEPS = 3  # so that a change at step 1 has a step before and after it
NAMES = ["latents", "prompt_embeds"]  # QwenImagePipeline._callback_tensor_inputs, and the edit pipeline's
BASE = {"prompt": "a cat", "negative_prompt": "blurry", "num_inference_steps": STEPS}


@pytest.fixture(params=["text2image", "edit"])
def workflow(request, qwen_pipe, qwen_edit_pipe):
    """Each workflow: (its name, our pipeline, its run_both, its own inputs, its classic_from)."""
    if request.param == "text2image":
        return "text2image", qwen_pipe, run_both, {"height": SIZE, "width": SIZE}, classic_from
    request.getfixturevalue("small_edit_area")
    return "edit", qwen_edit_pipe, run_both_edit, {"image": make_image()}, edit_classic_from


def both(workflow, callback, **inputs):
    """Ours and the classic pipeline's latents with `callback`, asking for every tensor the classic offers."""
    name, pipe, run, own, _ = workflow
    kwargs = {**BASE, **own, "output_type": "latent", **inputs}
    return run(pipe, name, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=NAMES, **kwargs)


def ours_plain(workflow, **inputs):
    """Our latents without a callback."""
    _, pipe, _, own, _ = workflow
    return pipe(generator=seeded(0), output="images", **{**BASE, **own, "output_type": "latent", **inputs})


def test_both_workflows_offer_the_classic_tensor_names(workflow):
    """The pipeline offers what the classic pipeline's _callback_tensor_inputs lists."""
    name, pipe, _, _, classic = workflow
    assert pipe.callback_tensor_inputs == NAMES == classic(pipe, name)._callback_tensor_inputs


@pytest.mark.parametrize("case", [{}, {"num_images_per_prompt": 2}, {"true_cfg_scale": 1.0}])
def test_the_callback_gets_the_classic_tensors_at_the_classic_steps(workflow, case):
    """At every step both pipelines hand the callback the same step index, timestep, packed latents and
    prompt_embeds, and the outputs are equal."""
    callback = RecordingCallback()
    ours, theirs = both(workflow, callback, **case)
    assert_identical(ours, theirs)
    assert_same_calls(callback, NAMES, STEPS)
    latents, prompt_embeds = (callback.calls[OURS][0].values[name] for name in NAMES)
    images = case.get("num_images_per_prompt", 1)
    assert latents.dim() == 3 and latents.shape[0] == images and latents.shape[2] == 16
    assert prompt_embeds.dim() == 3 and prompt_embeds.shape[0] == images


def test_a_callback_changing_latents_at_one_step_equals_the_classic(workflow):
    """Latents a callback replaces at step 1 are what steps 2 and on denoise, as in the classic pipeline."""
    callback = RecordingCallback(changes={1: lambda given: {"latents": given["latents"] * 0.5}})
    ours, theirs = both(workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(workflow))


def test_a_callback_replacing_prompt_embeds_equals_the_classic(workflow):
    """New prompt_embeds given back at step 0 condition the later steps, as in the classic pipeline."""
    callback = RecordingCallback(changes={0: lambda given: {"prompt_embeds": given["prompt_embeds"] * 1.5}})
    ours, theirs = both(workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(workflow))
    later, first = (callback.calls[OURS][k].values["prompt_embeds"] for k in (1, 0))
    assert torch.equal(later, first * 1.5)


@pytest.mark.parametrize("flag", ["_interrupt", "interrupt"])
def test_interrupt_at_step_1_returns_what_the_classic_returns(workflow, flag):
    """A callback that sets the flag at step 1 ends the loop after it: the decoded images equal the classic
    pipeline's interrupted ones, and the next call runs every step."""
    callback = RecordingCallback(sets={1: {flag: True}})
    ours, theirs = both(workflow, callback, output_type="np")
    assert_identical(ours, theirs)
    assert callback.step_indexes == {CLASSIC: [0, 1], OURS: [0, 1]}
    again = RecordingCallback()
    assert_identical(*both(workflow, again, output_type="np"))
    assert again.step_indexes[OURS] == [0, 1, 2]


def test_a_guidance_scale_set_by_a_callback_changes_nothing(workflow):
    """The classic pipelines read true_cfg_scale once: a callback setting pipeline._guidance_scale (diffusers'
    CFG cutoff callbacks do) leaves the remaining steps guided, in ours as in the classic."""
    callback = RecordingCallback(sets={0: {"_guidance_scale": 0.0}})
    ours, theirs = both(workflow, callback)
    assert_identical(ours, theirs)
    assert torch.equal(ours, ours_plain(workflow))
