"""Step callbacks on every SDXL workflow equal the classic pipelines' with the same callback: the tensors offered
(names, layout, values: prompt_embeds, add_text_embeds and add_time_ids as classifier-free batches), tensors
replaced, diffusers' SDXL CFG cutoff callback, the interrupt flag."""

import pytest
import torch
from diffusers.callbacks import MultiPipelineCallbacks, SDXLCFGCutoffCallback

from blocks.stable_diffusion.tiny import make_tiny_ip_adapter
from blocks.stable_diffusion_xl.denoise import (
    StableDiffusionXLDenoiseStep,
    StableDiffusionXLInpaintDenoiseStep,
)

from ..callback_helpers import (
    ShiftLatents,
    assert_both_see_the_same_tensors,
    assert_interrupt_equals_the_classic,
    assert_ip_adapter_cutoff_is_classic_for_its_call,
    changed_latents,
    changed_mask,
)
from ..helpers import assert_identical, make_image, make_mask
from .conftest import SDXL, run_both

REFINER = {"requires_aesthetics_score": True, "force_zeros_for_empty_prompt": False}

STEPS = 3  # a step before a change, the step of the change, and one after it

# 32x32 pixels (16x16 latents), not the tiny repos' default 64x64: what a callback is offered and what it changes
# do not depend on the size, and each call takes half the time.
SIZE = {"height": 32, "width": 32}
IMAGE = {"image": make_image(size=32), "strength": 1.0}

# The classic inpainting pipeline's default guidance is 7.5 (ours is SDXL's 5.0 in every workflow).
INPAINT = {"image": make_image(size=32), "mask_image": make_mask(size=32), "guidance_scale": 7.5, **SIZE}

#: Per workflow: the pipeline fixture, the classic name, the inputs besides the prompt, the classic's config.
WORKFLOWS = {
    "text2image": ("sdxl_pipe", "text2image", SIZE, {}),
    "text2image_negative_sizes": (
        "sdxl_pipe",
        "text2image",
        {"negative_original_size": (40, 24), "negative_target_size": (32, 48), **SIZE},
        {},
    ),
    "image2image": ("sdxl_pipe", "image2image", IMAGE, {}),
    "refiner": ("sdxl_refiner_pipe", "image2image", IMAGE, REFINER),
    "inpainting_4ch": ("sdxl_pipe", "inpainting", INPAINT, {}),
    "inpainting_9ch": ("sdxl_inpaint_pipe", "inpainting", INPAINT, {}),
}


def run_workflow(request, workflow, **kwargs):
    """Ours and the classic pipeline's latents for `workflow` with `kwargs`."""
    fixture, classic, inputs, config = WORKFLOWS[workflow]
    pipe = request.getfixturevalue(fixture)
    call = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **inputs, **kwargs}
    return run_both(pipe, classic, classic_config=config, **call)


def classic_names(workflow):
    return list(SDXL.classic[WORKFLOWS[workflow][1]]._callback_tensor_inputs)


@pytest.mark.parametrize(
    ("loop", "workflow"),
    [(StableDiffusionXLDenoiseStep, "text2image"), (StableDiffusionXLDenoiseStep, "image2image")]
    + [(StableDiffusionXLInpaintDenoiseStep, "inpainting_4ch")],
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
    for name in ("prompt_embeds", "add_text_embeds", "add_time_ids"):  # classifier-free: [negative, positive]
        assert seen[0][2][name].shape[0] == (images if guidance else 2 * images)


def swapped_embeds(pipeline, step, timestep, callback_kwargs):
    """At the first step, each classifier-free batch rolled by one row (negative and positive trade places)."""
    if step == 0:
        return {name: value.roll(1, dims=0) * 1.25 for name, value in callback_kwargs.items()}
    return {}


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
def test_a_callback_that_changes_latents_equals_the_classic(request, workflow):
    assert_identical(*run_workflow(request, workflow, callback_on_step_end=changed_latents))


ALL_BATCHES = ["prompt_embeds", "add_text_embeds", "add_time_ids"]


# Every workflow with all three batches and one image; one batch alone, and two images per prompt, once each.
@pytest.mark.parametrize(
    ("workflow", "images", "names"),
    [(workflow, 1, ALL_BATCHES) for workflow in WORKFLOWS]
    + [("text2image", 1, ["prompt_embeds"]), ("text2image", 2, ALL_BATCHES)],
)
def test_a_callback_that_replaces_embeddings_equals_the_classic(request, workflow, images, names):
    ours, theirs = run_workflow(
        request,
        workflow,
        num_images_per_prompt=images,
        callback_on_step_end=swapped_embeds,
        callback_on_step_end_tensor_inputs=names,
    )
    assert_identical(ours, theirs)
    unchanged, _ = run_workflow(request, workflow, num_images_per_prompt=images)
    assert not torch.equal(ours, unchanged)


def test_a_returned_add_time_ids_of_another_batch_is_refused(sdxl_pipe):
    def three_rows(pipeline, step, timestep, callback_kwargs):
        return {"add_time_ids": torch.cat([callback_kwargs["add_time_ids"]] * 3)[:3]}

    with pytest.raises(ValueError, match=r"'add_time_ids' with 3 rows; the loop takes 2 .* or 1"):
        sdxl_pipe(
            prompt="a cat",
            num_inference_steps=STEPS,
            output_type="latent",
            **SIZE,
            callback_on_step_end=three_rows,
            callback_on_step_end_tensor_inputs=["add_time_ids"],
        )


CFG_CUTOFFS = {
    "ratio": lambda: SDXLCFGCutoffCallback(cutoff_step_ratio=0.4),
    "index": lambda: SDXLCFGCutoffCallback(cutoff_step_ratio=None, cutoff_step_index=2),
    "multi": lambda: MultiPipelineCallbacks(
        [
            SDXLCFGCutoffCallback(cutoff_step_ratio=None, cutoff_step_index=1),
            ShiftLatents(cutoff_step_ratio=None, cutoff_step_index=2),
        ]
    ),
}


@pytest.mark.parametrize("workflow", ["text2image", "image2image", "refiner"])
@pytest.mark.parametrize("callback", list(CFG_CUTOFFS))
def test_the_cfg_cutoff_callbacks_equal_the_classic(request, workflow, callback):
    """SDXLCFGCutoffCallback (by ratio, by index, with another callback) turns guidance off for the remaining
    steps as in the classic pipelines, which read the scale at every step."""
    ours, theirs = run_workflow(
        request, workflow, num_inference_steps=4, callback_on_step_end=CFG_CUTOFFS[callback]()
    )
    assert_identical(ours, theirs)
    guided_throughout, _ = run_workflow(request, workflow, num_inference_steps=4)
    assert not torch.equal(ours, guided_throughout)


def test_a_cfg_cutoff_is_for_its_call_only(sdxl_pipe):
    call = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **SIZE}
    sdxl_pipe(**call, callback_on_step_end=SDXLCFGCutoffCallback(cutoff_step_ratio=None, cutoff_step_index=0))
    assert_identical(*run_both(sdxl_pipe, "text2image", **call))


@pytest.mark.parametrize("workflow", list(WORKFLOWS))
@pytest.mark.parametrize("attribute", ["_interrupt", "interrupt"])
def test_an_interrupt_at_step_1_equals_the_classic_interrupt(request, workflow, attribute):
    """Classic pipelines take ``pipeline._interrupt = True``; ours takes it and the peer's ``interrupt``, and
    both equal the classic ``_interrupt``; the flag is reset when the next call starts."""
    fixture, classic_workflow, inputs, config = WORKFLOWS[workflow]
    pipe = request.getfixturevalue(fixture)
    call = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **inputs}
    assert_interrupt_equals_the_classic(SDXL, pipe, classic_workflow, call, attribute, config)


def test_the_ip_adapter_scale_cutoff_equals_the_classic_for_its_call(sdxl_repo, tmp_path):
    ip_repo = make_tiny_ip_adapter(tmp_path / "ip", sdxl_repo)
    assert_ip_adapter_cutoff_is_classic_for_its_call(SDXL, sdxl_repo, ip_repo, **SIZE)


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
