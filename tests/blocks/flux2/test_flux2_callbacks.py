"""Step callbacks on both Flux.2 workflows: the classic pipeline's tensors (packed latents, prompt_embeds) in its
layout, replacements taken back, and the interrupt flag, all bit for bit equal to Flux2Pipeline given the same
callback."""

import pytest
import torch

from ..callback_recording import CLASSIC, OURS, RecordingCallback, assert_same_calls
from ..helpers import assert_identical, seeded
from .conftest import SIZE, classic_from, make_image, run_both

STEPS = 3  # so that a change at step 1 has a step before and after it
NAMES = ["latents", "prompt_embeds"]  # Flux2Pipeline._callback_tensor_inputs
BASE = {"prompt": "a cat", "height": SIZE, "width": SIZE, "num_inference_steps": STEPS}
WORKFLOWS = {"text2image": {}, "image_conditioned": {"image": make_image()}}


@pytest.fixture(params=list(WORKFLOWS))
def workflow(request):
    """Each Flux.2 workflow."""
    return request.param


def both(pipe, workflow, callback, **inputs):
    """Ours and the classic pipeline's latents with `callback`, asking for every tensor the classic offers."""
    kwargs = {**BASE, **WORKFLOWS[workflow], "output_type": "latent", **inputs}
    return run_both(
        pipe, workflow, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=NAMES, **kwargs
    )


def ours_plain(pipe, workflow, **inputs):
    """Our latents without a callback."""
    kwargs = {**BASE, **WORKFLOWS[workflow], "output_type": "latent", "output": "images", **inputs}
    return pipe(generator=seeded(0), **kwargs)


def test_both_workflows_offer_the_classic_tensor_names(flux2_pipe, workflow):
    """The workflow's blocks, and the pipeline, offer what the classic pipeline's _callback_tensor_inputs lists."""
    offered = flux2_pipe.blocks.get_workflow(workflow).callback_tensor_inputs
    assert offered == flux2_pipe.callback_tensor_inputs == NAMES
    assert offered == classic_from(flux2_pipe, workflow)._callback_tensor_inputs


def test_the_callback_gets_the_classic_tensors_at_the_classic_steps(flux2_pipe, workflow):
    """At every step both pipelines hand the callback the same step index, timestep, packed latents [B, tokens, C]
    and prompt_embeds [B, seq_len, layers * dim], and the outputs are equal."""
    callback = RecordingCallback()
    ours, theirs = both(flux2_pipe, workflow, callback, num_images_per_prompt=2, max_sequence_length=16)
    assert_identical(ours, theirs)
    assert_same_calls(callback, NAMES, STEPS)
    latents, prompt_embeds = (callback.calls[OURS][0].values[name] for name in NAMES)
    assert latents.shape == (2, 64, 16)  # the generated image's tokens only, never the reference ones
    assert prompt_embeds.shape == (2, 16, 48)


def test_a_callback_changing_latents_at_one_step_equals_the_classic(flux2_pipe, workflow):
    """Latents a callback replaces at step 1 are what steps 2 and on denoise, as in the classic pipeline."""
    callback = RecordingCallback(changes={1: lambda given: {"latents": given["latents"] * 0.5}})
    ours, theirs = both(flux2_pipe, workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(flux2_pipe, workflow))
    assert_same_calls(callback, NAMES, STEPS)


def test_a_callback_replacing_prompt_embeds_equals_the_classic(flux2_pipe, workflow):
    """New prompt_embeds given back at step 0 condition the later steps, as in the classic pipeline."""
    callback = RecordingCallback(changes={0: lambda given: {"prompt_embeds": given["prompt_embeds"] * 1.5}})
    ours, theirs = both(flux2_pipe, workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(flux2_pipe, workflow))


@pytest.mark.parametrize("flag", ["_interrupt", "interrupt"])
def test_interrupt_at_step_1_returns_what_the_classic_returns(flux2_pipe, workflow, flag):
    """A callback that sets the flag at step 1 ends the loop after it: the decoded images equal the classic
    pipeline's interrupted ones, and the next call runs every step again."""
    callback = RecordingCallback(sets={1: {flag: True}})
    ours, theirs = both(flux2_pipe, workflow, callback, output_type="np")
    assert_identical(ours, theirs)
    assert callback.step_indexes == {CLASSIC: [0, 1], OURS: [0, 1]}
    again = RecordingCallback()
    ours, theirs = both(flux2_pipe, workflow, again, output_type="np")
    assert_identical(ours, theirs)
    assert again.step_indexes[OURS] == [0, 1, 2]


def test_asking_for_another_tensor_is_refused(flux2_pipe):
    """image_latents is not among the classic pipeline's callback tensors: refused before any model runs."""
    with pytest.raises(
        ValueError, match=r"asks for \['image_latents'\].*offers \['latents', 'prompt_embeds'\]"
    ):
        flux2_pipe(
            **BASE,
            callback_on_step_end=RecordingCallback(),
            callback_on_step_end_tensor_inputs=["image_latents"],
        )
