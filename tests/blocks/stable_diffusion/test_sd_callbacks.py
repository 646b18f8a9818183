"""Step callbacks on every Stable Diffusion workflow equal the classic pipelines' with the same callback: the
tensors offered (names, layout, values), tensors replaced, diffusers' CFG cutoff callbacks, the interrupt flag."""

import pytest
import torch
from diffusers.callbacks import MultiPipelineCallbacks, SDCFGCutoffCallback

from blocks.stable_diffusion.denoise import StableDiffusionDenoiseStep, StableDiffusionInpaintDenoiseStep
from blocks.stable_diffusion.tiny import make_tiny_ip_adapter

from ..callback_helpers import (
    ShiftLatents,
    assert_both_see_the_same_tensors,
    assert_interrupt_equals_the_classic,
    assert_ip_adapter_cutoff_is_classic_for_its_call,
    assert_ip_adapter_cutoff_stays_in_its_thread,
    changed_latents,
    changed_mask,
)
from ..helpers import assert_identical, make_image, make_mask
from .conftest import SD, run_both

STEPS = 3  # a step before a change, the step of the change, and one after it

# 32x32 pixels (16x16 latents), not the tiny repos' default 64x64: what a callback is offered and what it changes
# do not depend on the size, and each call takes half the time.
SIZE = {"height": 32, "width": 32}
INPAINT = {"image": make_image(size=32), "mask_image": make_mask(size=32), **SIZE}

#: Per workflow: the pipeline fixture, the classic name, and the inputs besides the prompt.
WORKFLOWS = {
    "text2image": ("sd_pipe", "text2image", SIZE),
    "image2image": ("sd_pipe", "image2image", {"image": make_image(size=32), "strength": 1.0}),
    "inpainting_4ch": ("sd_pipe", "inpainting", INPAINT),
    "inpainting_9ch": ("sd_inpaint_pipe", "inpainting", INPAINT),
}


def run_workflow(request, workflow, **kwargs):
    """Ours and the classic pipeline's latents for `workflow` with `kwargs`."""
    fixture, classic, inputs = WORKFLOWS[workflow]
    pipe = request.getfixturevalue(fixture)
    call = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **inputs, **kwargs}
    return run_both(pipe, classic, **call)


def classic_names(workflow):
    return list(SD.classic[WORKFLOWS[workflow][1]]._callback_tensor_inputs)


@pytest.mark.parametrize(
    ("loop", "workflow"),
    [(StableDiffusionDenoiseStep, "text2image"), (StableDiffusionDenoiseStep, "image2image")]
    + [(StableDiffusionInpaintDenoiseStep, "inpainting_4ch")],
)
def test_each_loop_offers_the_tensors_of_its_classic_pipeline(loop, workflow):
    assert loop().callback_tensor_inputs == classic_names(workflow)


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
@pytest.mark.parametrize(("images", "guidance"), [(1, {}), (2, {}), (2, {"guidance_scale": 1.0})])
def test_a_callback_sees_the_tensors_of_the_classic_pipeline(request, workflow, images, guidance):
    """Every offered tensor, at every step, has the classic name, shape and value (prompt_embeds doubled)."""
    names = classic_names(workflow)
    seen = assert_both_see_the_same_tensors(
        lambda record: run_workflow(
            request,
            workflow,
            num_images_per_prompt=images,
            **guidance,
            callback_on_step_end=record,
            callback_on_step_end_tensor_inputs=names,
        ),
        names,
    )
    rows = images if guidance else 2 * images  # classifier-free: [negative, positive]; without: positive
    assert seen[0][2]["prompt_embeds"].shape[0] == rows


def swapped_prompt_embeds(pipeline, step, timestep, callback_kwargs):
    """At the first step, the classifier-free batch rolled by one row (negative and positive trade places)."""
    if step == 0:
        embeds = callback_kwargs["prompt_embeds"]
        return {"prompt_embeds": embeds.roll(1, dims=0) * 1.25}
    return {}


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
def test_a_callback_that_changes_latents_equals_the_classic(request, workflow):
    assert_identical(*run_workflow(request, workflow, callback_on_step_end=changed_latents))


# Every workflow with one image; two images per prompt once (the batch layout is the same in every workflow).
@pytest.mark.parametrize(
    ("workflow", "images"), [(workflow, 1) for workflow in WORKFLOWS] + [("text2image", 2)]
)
def test_a_callback_that_replaces_prompt_embeds_equals_the_classic(request, workflow, images):
    ours, theirs = run_workflow(
        request,
        workflow,
        num_images_per_prompt=images,
        callback_on_step_end=swapped_prompt_embeds,
        callback_on_step_end_tensor_inputs=["prompt_embeds"],
    )
    assert_identical(ours, theirs)
    unchanged, _ = run_workflow(request, workflow, num_images_per_prompt=images)
    assert not torch.equal(ours, unchanged)


def test_a_returned_negative_prompt_embeds_changes_nothing_as_in_the_classic(sd_pipe):
    """The classic loop reads the joined prompt_embeds only: a new negative_prompt_embeds is seen by the next
    callback and changes no image."""
    shown = []

    def replace_negative(pipeline, step, timestep, callback_kwargs):
        shown.append(callback_kwargs["negative_prompt_embeds"].clone())
        return {"negative_prompt_embeds": callback_kwargs["negative_prompt_embeds"] * 0 + step + 1}

    names = ["negative_prompt_embeds"]
    call = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **SIZE}
    ours, theirs = run_both(
        sd_pipe,
        "text2image",
        callback_on_step_end=replace_negative,
        callback_on_step_end_tensor_inputs=names,
        **call,
    )
    assert_identical(ours, theirs)
    assert_identical(ours, run_both(sd_pipe, "text2image", **call)[0])
    # Theirs, then ours: each call's first callback saw the encoded negative, its second the first one's value.
    count = len(shown) // 2
    assert_identical(shown[count], shown[0])
    assert_identical(shown[count + 1], torch.ones_like(shown[0]))
    assert_identical(shown[1], torch.ones_like(shown[0]))


def test_a_returned_prompt_embeds_of_another_batch_is_refused(sd_pipe):
    def three_rows(pipeline, step, timestep, callback_kwargs):
        return {"prompt_embeds": torch.cat([callback_kwargs["prompt_embeds"]] * 3)[:3]}

    with pytest.raises(ValueError, match=r"'prompt_embeds' with 3 rows; the loop takes 2 .* or 1"):
        sd_pipe(
            prompt="a cat",
            num_inference_steps=STEPS,
            output_type="latent",
            **SIZE,
            callback_on_step_end=three_rows,
            callback_on_step_end_tensor_inputs=["prompt_embeds"],
        )


CFG_CUTOFFS = {
    "ratio": lambda: SDCFGCutoffCallback(cutoff_step_ratio=0.4),
    "index": lambda: SDCFGCutoffCallback(cutoff_step_ratio=None, cutoff_step_index=2),
    "multi": lambda: MultiPipelineCallbacks(
        [
            SDCFGCutoffCallback(cutoff_step_ratio=None, cutoff_step_index=1),
            ShiftLatents(cutoff_step_ratio=None, cutoff_step_index=2),
        ]
    ),
}


@pytest.mark.parametrize("workflow", ["text2image", "image2image"])
@pytest.mark.parametrize("callback", list(CFG_CUTOFFS))
def test_the_cfg_cutoff_callbacks_equal_the_classic(request, workflow, callback):
    """SDCFGCutoffCallback (by ratio, by index, with another callback) turns guidance off for the remaining
    steps as in the classic pipelines, which read the scale at every step."""
    ours, theirs = run_workflow(
        request, workflow, num_inference_steps=4, callback_on_step_end=CFG_CUTOFFS[callback]()
    )
    assert_identical(ours, theirs)
    guided_throughout, _ = run_workflow(request, workflow, num_inference_steps=4)
    assert not torch.equal(ours, guided_throughout)


def test_a_cfg_cutoff_is_for_its_call_only(sd_pipe):
    call = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **SIZE}
    sd_pipe(**call, callback_on_step_end=SDCFGCutoffCallback(cutoff_step_ratio=None, cutoff_step_index=0))
    assert_identical(*run_both(sd_pipe, "text2image", **call))


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
@pytest.mark.parametrize("attribute", ["_interrupt", "interrupt"])
def test_an_interrupt_at_step_1_equals_the_classic_interrupt(request, workflow, attribute):
    """Classic pipelines take ``pipeline._interrupt = True``; ours takes it and the peer's ``interrupt``, and
    both equal the classic ``_interrupt``; the flag is reset when the next call starts."""
    fixture, classic_workflow, inputs = WORKFLOWS[workflow]
    pipe = request.getfixturevalue(fixture)
    call = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **inputs}
    assert_interrupt_equals_the_classic(SD, pipe, classic_workflow, call, attribute)


def test_the_ip_adapter_scale_cutoff_equals_the_classic_for_its_call(sd_repo, tmp_path):
    assert_ip_adapter_cutoff_is_classic_for_its_call(
        SD, sd_repo, make_tiny_ip_adapter(tmp_path / "ip", sd_repo), **SIZE
    )


def test_an_ip_adapter_scale_set_in_a_call_stays_out_of_another_threads_call(sd_repo, tmp_path):
    assert_ip_adapter_cutoff_stays_in_its_thread(
        SD, sd_repo, make_tiny_ip_adapter(tmp_path / "ip", sd_repo), **SIZE
    )


@pytest.mark.parametrize("workflow", ["inpainting_4ch", "inpainting_9ch"])
def test_a_callback_that_changes_the_mask_equals_the_classic(request, workflow):
    names = ["mask", "masked_image_latents"]
    ours, theirs = run_workflow(
        request, workflow, callback_on_step_end=changed_mask, callback_on_step_end_tensor_inputs=names
    )
    assert_identical(ours, theirs)
    assert not torch.equal(ours, run_workflow(request, workflow)[0])


def test_a_mask_with_unequal_halves_is_refused_for_a_9_channel_unet(request):
    def unequal(pipeline, step, timestep, callback_kwargs):
        mask = callback_kwargs["mask"]
        return {"mask": torch.cat([mask[:1], 1 - mask[1:]])}

    with pytest.raises(ValueError, match="'mask' whose negative and positive halves differ"):
        run_workflow(
            request,
            "inpainting_9ch",
            callback_on_step_end=unequal,
            callback_on_step_end_tensor_inputs=["mask"],
        )
