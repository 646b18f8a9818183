"""Step callbacks on every SD3 workflow: the classic pipelines' tensors in their layout (the classifier-free
batches of prompt_embeds and pooled_prompt_embeds), replacements taken back, the interrupt flag and the CFG
cutoff, all bit for bit equal to the classic SD3 pipelines given the same callback."""

import pytest
import torch
from diffusers.callbacks import SD3CFGCutoffCallback

from ..callback_recording import CLASSIC, OURS, RecordingCallback, assert_same_calls
from ..helpers import assert_identical, seeded
from .conftest import classic_from, make_image, make_mask, run_both

STEPS = 3  # so that a change at step 1 has a step before and after it
WORKFLOWS = {
    "text2image": {},
    "image2image": {"image": make_image(), "strength": 1.0},
    "inpainting": {"image": make_image(), "mask_image": make_mask(), "strength": 1.0},
}
# StableDiffusion3Pipeline's _callback_tensor_inputs, and the image-to-image and inpainting pipelines'.
CLASSIC_NAMES = {
    "text2image": ["latents", "prompt_embeds", "pooled_prompt_embeds"],
    "image2image": ["latents", "prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"],
    "inpainting": ["latents", "prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"],
}


@pytest.fixture(params=list(WORKFLOWS))
def workflow(request):
    """Each SD3 workflow."""
    return request.param


def classic_names(workflow, guided=True):
    """The tensors the classic pipeline offers; without guidance the negatives it holds are None (not asked)."""
    return [n for n in CLASSIC_NAMES[workflow] if guided or not n.startswith("negative")]


def both(pipe, workflow, callback, **inputs):
    """Ours and the classic pipeline's latents with `callback`, asking for every tensor the classic offers."""
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, **WORKFLOWS[workflow], "output_type": "latent"}
    kwargs.update(inputs)
    names = classic_names(workflow, kwargs.get("guidance_scale", 7.0) > 1)
    return run_both(
        pipe, workflow, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=names, **kwargs
    )


def ours_plain(pipe, workflow, **inputs):
    """Our latents without a callback."""
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, **WORKFLOWS[workflow], "output_type": "latent"}
    return pipe(generator=seeded(0), output="images", **{**kwargs, **inputs})


def test_every_workflow_offers_the_classic_tensor_names(sd3_pipe, workflow):
    """Each workflow's loop offers what its classic pipeline's _callback_tensor_inputs lists, and both sets of
    pooled embeddings (the union of the three classic pipelines' names)."""
    offered = sd3_pipe.blocks.get_workflow(workflow).callback_tensor_inputs
    classic = classic_from(sd3_pipe, workflow)._callback_tensor_inputs
    assert classic == CLASSIC_NAMES[workflow]
    assert set(classic) <= set(offered)
    assert offered == sd3_pipe.callback_tensor_inputs


@pytest.mark.parametrize("case", [{}, {"num_images_per_prompt": 2}, {"guidance_scale": 1.0}], ids=str)
def test_the_callback_gets_the_classic_tensors_at_the_classic_steps(sd3_pipe, workflow, case):
    """At every step both pipelines hand the callback the same step index, timestep and tensors: with guidance,
    prompt_embeds (and text-to-image's pooled_prompt_embeds) as the batch cat([negative, positive])."""
    callback = RecordingCallback()
    ours, theirs = both(sd3_pipe, workflow, callback, **case)
    assert_identical(ours, theirs)
    images = case.get("num_images_per_prompt", 1)
    guided = case.get("guidance_scale", 7.0) > 1
    assert_same_calls(callback, classic_names(workflow, guided), STEPS)
    prompt_embeds = callback.calls[OURS][0].values["prompt_embeds"]
    assert prompt_embeds.shape == ((2 if guided else 1) * images, 77 + 256, 80)


def test_a_callback_changing_latents_at_one_step_equals_the_classic(sd3_pipe, workflow):
    """Latents a callback replaces at step 1 are what steps 2 and on denoise, as in the classic pipeline."""
    callback = RecordingCallback(changes={1: lambda given: {"latents": given["latents"] * 0.5}})
    ours, theirs = both(sd3_pipe, workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(sd3_pipe, workflow))


def test_a_callback_replacing_the_guidance_batches_equals_the_classic(sd3_pipe):
    """prompt_embeds and pooled_prompt_embeds replaced at step 0 as whole classifier-free batches condition the
    later steps on both halves, as in the classic pipeline."""

    def scaled(given):
        return {
            "prompt_embeds": given["prompt_embeds"] * 1.5,
            "pooled_prompt_embeds": given["pooled_prompt_embeds"] * 0.5,
        }

    callback = RecordingCallback(changes={0: scaled})
    ours, theirs = both(sd3_pipe, "text2image", callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(sd3_pipe, "text2image"))
    later = callback.calls[OURS][1].values["prompt_embeds"]
    assert torch.equal(later, callback.calls[OURS][0].values["prompt_embeds"] * 1.5)


@pytest.mark.parametrize("workflow", ["image2image", "inpainting"])
def test_returned_negative_embeddings_change_nothing_as_in_the_classic(sd3_pipe, workflow):
    """negative_prompt_embeds and negative_pooled_prompt_embeds a callback returns are not read again by the
    classic loops (they joined the batch before it): the result is unchanged, and later callbacks see them."""

    def zeroed(given):
        return {
            name: torch.zeros_like(given[name])
            for name in ("negative_prompt_embeds", "negative_pooled_prompt_embeds")
        }

    callback = RecordingCallback(changes={0: zeroed})
    ours, theirs = both(sd3_pipe, workflow, callback)
    assert_identical(ours, theirs)
    assert_identical(ours, ours_plain(sd3_pipe, workflow))
    assert_same_calls(callback, CLASSIC_NAMES[workflow], STEPS)
    assert not callback.calls[OURS][1].values["negative_pooled_prompt_embeds"].any()


@pytest.mark.parametrize(
    "cutoff",
    [
        {"cutoff_step_ratio": 0.4, "cutoff_step_index": None},
        {"cutoff_step_ratio": None, "cutoff_step_index": 1},
    ],
    ids=["ratio", "index"],
)
def test_the_cfg_cutoff_callback_equals_the_classic(sd3_pipe, cutoff):
    """SD3CFGCutoffCallback turns guidance off for the remaining steps (keeping the positive rows of both
    batches) as in StableDiffusion3Pipeline, and the next call is guided again."""
    kwargs = {"prompt": "a cat", "num_inference_steps": 4, "output_type": "latent"}
    ours, theirs = run_both(
        sd3_pipe, "text2image", callback_on_step_end=SD3CFGCutoffCallback(**cutoff), **kwargs
    )
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(sd3_pipe, "text2image", num_inference_steps=4))
    assert_identical(*run_both(sd3_pipe, "text2image", **kwargs))


@pytest.mark.parametrize("flag", ["_interrupt", "interrupt"])
def test_interrupt_at_step_1_returns_what_the_classic_returns(sd3_pipe, workflow, flag):
    """A callback that sets the flag at step 1 ends the loop after it: the decoded images equal the classic
    pipeline's interrupted ones."""
    callback = RecordingCallback(sets={1: {flag: True}})
    ours, theirs = both(sd3_pipe, workflow, callback, output_type="np")
    assert_identical(ours, theirs)
    assert callback.step_indexes == {CLASSIC: [0, 1], OURS: [0, 1]}


def test_image2image_step_indexes_count_the_steps_strength_leaves(sd3_pipe):
    """With strength 0.5 of 4 steps, the callback is called at step indexes 0 and 1 with the classic timesteps."""
    callback = RecordingCallback()
    ours, theirs = both(sd3_pipe, "image2image", callback, num_inference_steps=4, strength=0.5)
    assert_identical(ours, theirs)
    assert_same_calls(callback, CLASSIC_NAMES["image2image"], 2)
