"""Step callbacks on every Flux workflow: the classic pipelines' tensors (packed latents, T5 prompt_embeds) in
their layout, replacements taken back, the interrupt flag and guidance set by a callback, all bit for bit equal
to the classic Flux pipelines given the same callback."""

import pytest
import torch

from ..callback_recording import CLASSIC, OURS, RecordingCallback, assert_same_calls
from ..helpers import assert_identical, seeded
from .conftest import classic_from, make_image, run_both

STEPS = 3  # so that a change at step 1 has a step before and after it
NAMES = ["latents", "prompt_embeds"]  # FluxPipeline._callback_tensor_inputs, and the other workflows'
BASE = {"prompt": "a cat", "height": 32, "width": 32, "max_sequence_length": 16, "num_inference_steps": STEPS}
WORKFLOWS = {
    "text2image": {},
    "image2image": {"image": make_image(), "strength": 1.0},
    "control": {"control_image": make_image(1)},
}


@pytest.fixture(params=list(WORKFLOWS))
def workflow(request):
    """Each Flux workflow."""
    return request.param


@pytest.fixture
def pipe(workflow, flux_pipe, flux_control_pipe):
    """Our pipeline for the workflow (control needs the control transformer's repo)."""
    return flux_control_pipe if workflow == "control" else flux_pipe


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


def test_every_workflow_offers_the_classic_tensor_names(pipe, workflow):
    """The workflow's blocks, and the pipeline, offer what the classic pipeline's _callback_tensor_inputs lists."""
    offered = pipe.blocks.get_workflow(workflow).callback_tensor_inputs
    assert (
        offered
        == pipe.callback_tensor_inputs
        == classic_from(pipe, workflow)._callback_tensor_inputs
        == NAMES
    )


CASES = {
    "one": {},
    "two_per_prompt": {"num_images_per_prompt": 2},
    "true_cfg": {"negative_prompt": "blurry", "true_cfg_scale": 2.0},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_callback_gets_the_classic_tensors_at_the_classic_steps(pipe, workflow, case):
    """At every step both pipelines hand the callback the same step index, timestep, packed latents
    [B, seq, C * 4] and prompt_embeds [B, seq, dim] (one row per image), and the outputs are equal."""
    if case == "true_cfg" and workflow == "control":
        pytest.skip("FluxControlPipeline takes no negative prompt (no true CFG)")
    callback = RecordingCallback()
    ours, theirs = both(pipe, workflow, callback, **CASES[case])
    assert_identical(ours, theirs)
    assert_same_calls(callback, NAMES, STEPS)
    latents, prompt_embeds = (callback.calls[OURS][0].values[name] for name in NAMES)
    images = CASES[case].get("num_images_per_prompt", 1)
    assert latents.shape == (images, 64, 16)  # 32 px -> 16 latent cells a side -> 8 x 8 patches of 4 x 4
    assert prompt_embeds.shape == (images, 16, 32)


def test_a_callback_changing_latents_at_one_step_equals_the_classic(pipe, workflow):
    """Latents a callback replaces at step 1 are what steps 2 and on denoise, as in the classic pipeline."""
    callback = RecordingCallback(changes={1: lambda given: {"latents": given["latents"] * 0.5}})
    ours, theirs = both(pipe, workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(pipe, workflow))
    assert_same_calls(callback, NAMES, STEPS)


def test_a_callback_replacing_prompt_embeds_equals_the_classic(pipe, workflow):
    """prompt_embeds replaced at step 0 (same shape, new values) condition the later steps, as in the classic."""
    callback = RecordingCallback(changes={0: lambda given: {"prompt_embeds": given["prompt_embeds"] * 1.5}})
    ours, theirs = both(pipe, workflow, callback)
    assert_identical(ours, theirs)
    assert not torch.equal(ours, ours_plain(pipe, workflow))
    later = callback.calls[OURS][1].values["prompt_embeds"]
    assert torch.equal(later, callback.calls[OURS][0].values["prompt_embeds"] * 1.5)


@pytest.mark.parametrize("flag", ["_interrupt", "interrupt"])
def test_interrupt_at_step_1_returns_what_the_classic_returns(pipe, workflow, flag):
    """A callback that sets the flag at step 1 (classic callbacks set pipeline._interrupt, the peer's
    pipeline.interrupt) ends the loop after it: the decoded images equal the classic pipeline's interrupted
    ones. The flag stays set after the call, as on the classic pipeline, and the next call resets it."""
    callback = RecordingCallback(sets={1: {flag: True}})
    ours, theirs = both(pipe, workflow, callback, output_type="np")
    assert_identical(ours, theirs)
    assert callback.step_indexes == {CLASSIC: [0, 1], OURS: [0, 1]}
    assert pipe.interrupt is True
    again = RecordingCallback()
    ours, theirs = both(pipe, workflow, again, output_type="np")
    assert_identical(ours, theirs)
    assert again.step_indexes[OURS] == [0, 1, 2]
    assert pipe.interrupt is False


def test_image2image_step_indexes_count_the_steps_strength_leaves(flux_pipe):
    """With strength 0.5 of 4 steps, the callback is called at step indexes 0 and 1 with the classic timesteps."""
    callback = RecordingCallback()
    ours, theirs = both(flux_pipe, "image2image", callback, num_inference_steps=4, strength=0.5)
    assert_identical(ours, theirs)
    assert_same_calls(callback, NAMES, 2)


def test_guidance_scale_set_by_a_callback_changes_nothing_as_in_the_classic(flux_pipe):
    """The classic Flux pipelines embed the guidance once, before the loop: a callback setting
    pipeline._guidance_scale changes nothing there, nor in ours."""
    callback = RecordingCallback(sets={0: {"_guidance_scale": 9.0}})
    ours, theirs = both(flux_pipe, "text2image", callback, guidance_scale=2.0)
    assert_identical(ours, theirs)
    assert_identical(ours, ours_plain(flux_pipe, "text2image", guidance_scale=2.0))


def test_asking_for_a_tensor_the_classic_does_not_offer_is_refused(flux_pipe):
    """pooled_prompt_embeds, which FluxPipeline does not offer either, is refused before any model runs."""
    with pytest.raises(
        ValueError, match=r"asks for \['pooled_prompt_embeds'\].*offers \['latents', 'prompt_embeds'\]"
    ):
        flux_pipe(
            prompt="a cat",
            callback_on_step_end=RecordingCallback(),
            callback_on_step_end_tensor_inputs=["latents", "pooled_prompt_embeds"],
        )


def test_the_ip_adapter_scale_cutoff_equals_the_classic_for_its_call(flux_repo, tmp_path):
    """diffusers' IPAdapterScaleCutoffCallback on Flux (true CFG, so the negative image prompt counts too)
    gives FluxPipeline's output, and its scale holds for its call only."""
    from blocks.flux.tiny import make_tiny_ip_adapter

    from ..callback_helpers import assert_ip_adapter_cutoff_is_classic_for_its_call
    from .conftest import FLUX

    assert_ip_adapter_cutoff_is_classic_for_its_call(
        FLUX,
        flux_repo,
        make_tiny_ip_adapter(tmp_path / "ip", flux_repo),
        denoiser="transformer",
        negative_prompt="blurry",
        true_cfg_scale=2.0,
        height=32,
        width=32,
    )
