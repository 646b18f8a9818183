"""Step callbacks on both Z-Image workflows: the classic pipelines' tensors (latents, prompt_embeds as a list of
[seq_len, dim] tensors) in their layout, replacements taken back, the interrupt flag, and a guidance scale set
by a callback read at every step, all bit for bit equal to the classic Z-Image pipelines given the same callback."""

import re

import pytest
import torch

from ..callback_recording import CLASSIC, OURS, RecordingCallback, assert_same_calls
from ..helpers import assert_identical, reference, seeded
from .conftest import SIZE, classic_from, make_image, run_both

STEPS = 3  # so that a change at step 1 has a step before and after it
NAMES = ["latents", "prompt_embeds"]  # ZImagePipeline._callback_tensor_inputs, and ZImageImg2ImgPipeline's
BASE = {"prompt": "a cat", "height": SIZE, "width": SIZE, "num_inference_steps": STEPS}
WORKFLOWS = {"text2image": {}, "image2image": {"image": make_image(), "strength": 1.0}}


@pytest.fixture(params=list(WORKFLOWS))
def workflow(request):
    """Each Z-Image workflow."""
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


def test_both_workflows_offer_the_classic_tensor_names(zimage_pipe, workflow):
    """The workflow's blocks, and the pipeline, offer what the classic pipeline's _callback_tensor_inputs lists."""
    offered = zimage_pipe.blocks.get_workflow(workflow).callback_tensor_inputs
    assert offered == zimage_pipe.callback_tensor_inputs == NAMES
    assert offered == classic_from(zimage_pipe, workflow)._callback_tensor_inputs


PROMPTS = {
    "one": {},
    # Prompts of different lengths, two images each: prompt_embeds is [a, a, b, b], each of its own length.
    "two_per_prompt_of_two": {"prompt": ["a cat", "a red dog on a green hill"], "num_images_per_prompt": 2},
    "no_guidance": {"guidance_scale": 0.0},
}


@pytest.mark.parametrize("case", list(PROMPTS))
def test_the_callback_gets_the_classic_tensors_at_the_classic_steps(zimage_pipe, workflow, case):
    """At every step both pipelines hand the callback the same step index, timestep, latents [B, C, H, W] and
    prompt_embeds as a list of one [seq_len, dim] tensor per image, and the outputs are equal."""
    callback = RecordingCallback()
    ours, theirs = both(zimage_pipe, workflow, callback, **PROMPTS[case])
    assert_identical(ours, theirs)
    assert_same_calls(callback, NAMES, STEPS)
    latents, prompt_embeds = (callback.calls[OURS][0].values[name] for name in NAMES)
    images = 4 if case == "two_per_prompt_of_two" else 1
    assert latents.shape == (images, 16, 16, 16)
    assert isinstance(prompt_embeds, list) and len(prompt_embeds) == images
    if images == 4:  # the images of one prompt share its length; the two prompts' lengths differ
        assert prompt_embeds[0].shape == prompt_embeds[1].shape != prompt_embeds[2].shape


def test_a_callback_changing_latents_at_one_step_equals_the_classic(zimage_pipe, workflow):
    """Latents a callback replaces at step 1 are what steps 2 and on denoise, as in the classic pipeline."""
    callback = RecordingCallback(changes={1: lambda given: {"latents": given["latents"] * 0.5}})
    ours, theirs = both(zimage_pipe, workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(zimage_pipe, workflow))
    assert_same_calls(callback, NAMES, STEPS)


@pytest.mark.parametrize("guidance_scale", [5.0, 0.0])
def test_a_callback_replacing_prompt_embeds_equals_the_classic(zimage_pipe, workflow, guidance_scale):
    """A new prompt_embeds list (each tensor of the same shape, new values) given back at step 0 conditions
    the later steps, with guidance and without (where the prompt stands in for the negative), as in the classic."""

    def louder(given):
        return {"prompt_embeds": [embeds * 1.5 for embeds in given["prompt_embeds"]]}

    callback = RecordingCallback(changes={0: louder})
    ours, theirs = both(zimage_pipe, workflow, callback, guidance_scale=guidance_scale)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(zimage_pipe, workflow, guidance_scale=guidance_scale))
    later, first = (callback.calls[OURS][k].values["prompt_embeds"] for k in (1, 0))
    assert all(torch.equal(a, b * 1.5) for a, b in zip(later, first, strict=True))


@pytest.mark.parametrize("flag", ["_interrupt", "interrupt"])
def test_interrupt_at_step_1_returns_what_the_classic_returns(zimage_pipe, workflow, flag):
    """A callback that sets the flag at step 1 (classic callbacks set pipeline._interrupt, the peer's
    pipeline.interrupt) ends the loop after it: the decoded images equal the classic pipeline's interrupted
    ones. The flag stays set after the call, as on the classic pipeline, and the next call resets it."""
    callback = RecordingCallback(sets={1: {flag: True}})
    ours, theirs = both(zimage_pipe, workflow, callback, output_type="np")
    assert_identical(ours, theirs)
    assert callback.step_indexes == {CLASSIC: [0, 1], OURS: [0, 1]}
    assert zimage_pipe.interrupt is True
    again = RecordingCallback()
    ours, theirs = both(zimage_pipe, workflow, again, output_type="np")
    assert_identical(ours, theirs)
    assert again.step_indexes[OURS] == [0, 1, 2]
    assert zimage_pipe.interrupt is False


BAD_PROMPT_EMBEDS = {
    "a_tensor": (lambda embeds: embeds[0], TypeError, "as a tensor of shape [10, 16]; Z-Image takes a list"),
    "batched": (lambda embeds: [e[None] for e in embeds], TypeError, "as a list of [[1, 10, 16]]; Z-Image"),
    "too_many": (lambda embeds: embeds * 2, ValueError, "returned 2 prompt_embeds for 1 images; return one"),
}


@pytest.mark.parametrize("case", list(BAD_PROMPT_EMBEDS))
def test_prompt_embeds_given_back_in_another_layout_are_refused(zimage_pipe, case):
    """prompt_embeds given back as one tensor (the SD layout), as 3-D tensors, or one per image too many is
    refused with the layout Z-Image takes; the pipeline works as before after."""
    change, error, message = BAD_PROMPT_EMBEDS[case]
    callback = RecordingCallback(changes={0: lambda given: {"prompt_embeds": change(given["prompt_embeds"])}})
    before = reference(zimage_pipe, height=SIZE, width=SIZE)
    with pytest.raises(error, match=re.escape(message)):
        zimage_pipe(**BASE, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=NAMES)
    assert callback.step_indexes[OURS] == [0]
    assert_identical(reference(zimage_pipe, height=SIZE, width=SIZE), before)


def test_image2image_step_indexes_count_the_steps_strength_leaves(zimage_pipe):
    """With strength 0.5 of 4 steps, the callback is called at step indexes 0 and 1 with the classic timesteps."""
    callback = RecordingCallback()
    ours, theirs = both(zimage_pipe, "image2image", callback, num_inference_steps=4, strength=0.5)
    assert_identical(ours, theirs)
    assert_same_calls(callback, NAMES, 2)


GUIDANCE_CHANGES = {
    "cutoff": ({}, 0.0),  # what diffusers' CFG cutoff callbacks do: guidance off for the remaining steps
    "lower": ({}, 2.0),
    "lower_with_truncation": ({"cfg_truncation": 0.5, "cfg_normalization": 1.1}, 2.0),
}


@pytest.mark.parametrize("case", list(GUIDANCE_CHANGES))
def test_guidance_scale_set_by_a_callback_holds_for_the_remaining_steps(zimage_pipe, workflow, case):
    """The classic Z-Image pipelines read pipeline._guidance_scale at every step: a callback that sets it at
    step 0 sets the scale of steps 1 and 2 (0 turns guidance off, one pass per step), in ours as in the classic."""
    options, scale = GUIDANCE_CHANGES[case]
    callback = RecordingCallback(sets={0: {"_guidance_scale": scale}})
    ours, theirs = both(zimage_pipe, workflow, callback, **options)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(zimage_pipe, workflow, **options))


def test_guidance_turned_on_by_a_callback_in_a_call_without_it_is_refused(zimage_pipe):
    """A call begun with guidance_scale 0 has no negative embeddings: a callback setting a scale above 0 gets
    a ValueError naming the fix (the classic pipeline fails in the transformer), and the pipeline works after."""
    callback = RecordingCallback(sets={0: {"_guidance_scale": 4.0}})
    before = reference(zimage_pipe, height=SIZE, width=SIZE)
    with pytest.raises(
        ValueError, match=r"set pipeline._guidance_scale to 4.0 .* start the call with guidance_scale > 0"
    ):
        zimage_pipe(**BASE, guidance_scale=0.0, callback_on_step_end=callback)
    assert callback.step_indexes[OURS] == [0]
    assert_identical(reference(zimage_pipe, height=SIZE, width=SIZE), before)


def test_asking_for_negative_prompt_embeds_is_refused(zimage_pipe):
    """negative_prompt_embeds is not among the classic pipelines' callback tensors: refused before any model runs."""
    with pytest.raises(
        ValueError, match=r"asks for \['negative_prompt_embeds'\].*offers \['latents', 'prompt_embeds'\]"
    ):
        zimage_pipe(
            **BASE,
            callback_on_step_end=RecordingCallback(),
            callback_on_step_end_tensor_inputs=["negative_prompt_embeds"],
        )
