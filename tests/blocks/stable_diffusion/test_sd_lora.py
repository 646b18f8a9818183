"""LoRA through our Stable Diffusion pipeline, bit for bit with StableDiffusionPipeline's own loader."""

import concurrent.futures
import contextlib
import threading

import pytest
from diffusers import StableDiffusionPipeline
from safetensors.torch import load_file

from ..helpers import assert_identical
from ..lora_helpers import (
    CASES,
    CLIP_TARGETS,
    DENOISER_TARGETS,
    SCALES,
    assert_case_matches_classic,
    assert_parity_through,
    assert_scale_matches_classic,
    kohya_copy,
    lora_scalings,
    loras_fixture,
    make_lora,
    ours_and_classic,
    run,
    same,
    text2image_inputs,
)
from .conftest import SD

# 32x32 pixels, as the other families' LoRA tests (not the tiny repo's default 64x64): what a LoRA call changes
# does not depend on the size, and each call does a quarter of the work.
INPUTS = text2image_inputs(height=32, width=32)


loras = loras_fixture(
    SD, "sd_repo", StableDiffusionPipeline, {"unet": DENOISER_TARGETS, "text_encoder": CLIP_TARGETS}
)


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(sd_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    weights = {"unet": 0.8, "text_encoder": 0.5}
    assert_case_matches_classic(SD, sd_repo, loras, case, weights, ["unet", "text_encoder"], INPUTS)


def test_one_file_goes_into_the_unet_and_the_text_encoder(sd_repo, loras):
    """A LoRA file with UNet and text encoder keys loads into both, under one adapter name."""
    ours = SD.load_pipeline(sd_repo)
    ours.load_lora_weights(loras[0])
    assert ours.get_list_adapters() == {"unet": ["default_0"], "text_encoder": ["default_0"]}
    assert ours.get_active_adapters() == ["default_0"]


def test_a_kohya_file_matches_the_classic_pipeline_and_the_diffusers_file(sd_repo, loras, tmp_path):
    """kohya/A1111 key names are converted by diffusers: same images as the classic loader and as the
    diffusers-format file of the same weights."""
    kohya = kohya_copy(
        loras[0], tmp_path / "kohya", alpha=8.0, prefixes={"unet": "lora_unet", "text_encoder": "lora_te"}
    )
    ours, classic = ours_and_classic(SD, sd_repo)
    images = assert_parity_through(
        ours, classic, [lambda pipe: pipe.load_lora_weights(kohya, adapter_name="k")], INPUTS
    )
    reference = SD.load_pipeline(sd_repo)
    reference.load_lora_weights(loras[0], adapter_name="d")
    assert_identical(images[0], run(reference, INPUTS))


def test_a_state_dict_loads_as_the_classic_pipeline_loads_it(sd_repo, loras):
    """A state dict in memory (no file metadata: alpha taken as the rank) gives the classic loader's images, and
    the caller's dict is left as it was."""
    state_dict = load_file(loras[0] / "pytorch_lora_weights.safetensors")
    keys = list(state_dict)
    ours, classic = ours_and_classic(SD, sd_repo)
    images = assert_parity_through(ours, classic, [lambda pipe: pipe.load_lora_weights(state_dict)], INPUTS)
    assert not same(images[0], run(SD.load_pipeline(sd_repo), INPUTS))
    assert list(state_dict) == keys


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_scales_the_text_encoder_as_the_classic_pipeline(sd_repo, loras, scale):
    """cross_attention_kwargs={"scale": s} scales the LoRA in the text encoder too: the classic images."""
    assert_scale_matches_classic(SD, sd_repo, loras[0], "cross_attention_kwargs", scale, INPUTS)


def test_a_failed_encoding_leaves_every_lora_scale_as_it_was(sd_repo, loras, monkeypatch):
    """A scaled call whose text encoder fails leaves the LoRA layers' scales as before: the next call is unscaled."""
    pipe = SD.load_pipeline(sd_repo)
    pipe.load_lora_weights(loras[0])
    expected, before = run(pipe, INPUTS), lora_scalings(pipe)

    def fail(*args, **kwargs):
        raise RuntimeError("the text encoder failed")

    monkeypatch.setattr(pipe.text_encoder, "forward", fail)
    with pytest.raises(RuntimeError, match="the text encoder failed"):
        run(pipe, {**INPUTS, "cross_attention_kwargs": {"scale": 0.5}})
    monkeypatch.undo()
    assert lora_scalings(pipe) == before
    assert same(run(pipe, INPUTS), expected)


def test_a_call_at_scale_zero_keeps_the_weights_set_adapters_gave(sd_repo, loras):
    """After a call at LoRA scale 0 every LoRA layer has its set_adapters weight again, and the next call gives what
    it gave before (diffusers resets a layer to the adapter's base scale after a scale of 0: its UNet forward
    does; our text encoding does not, and the denoising loop puts the UNet's back)."""
    pipe = SD.load_pipeline(sd_repo)
    pipe.load_lora_weights(loras[0], adapter_name="a")
    pipe.set_adapters(["a"], adapter_weights=[{"unet": 0.5, "text_encoder": 0.5}])
    before, scalings = run(pipe, INPUTS), lora_scalings(pipe)
    run(pipe, {**INPUTS, "cross_attention_kwargs": {"scale": 0.0}})
    assert lora_scalings(pipe) == scalings
    assert same(run(pipe, INPUTS), before)


def test_two_threads_at_two_scales_on_one_text_encoder_each_get_their_own(sd_repo, tmp_path):
    """Two threads calling one pipeline at LoRA scales 0.5 and 1.3 each get the images of their scale alone:
    the shared text encoder is scaled for one encoding at a time (the LoRA covers only the text encoder, so
    the UNet's own per-forward scaling is not involved)."""
    pipe = SD.load_pipeline(sd_repo)
    lora = make_lora(
        tmp_path / "te", StableDiffusionPipeline, {"text_encoder": (pipe.text_encoder, CLIP_TARGETS)}
    )
    pipe.load_lora_weights(lora)
    calls = {scale: {**INPUTS, "cross_attention_kwargs": {"scale": scale}} for scale in (0.5, 1.3)}
    expected = {scale: run(pipe, inputs) for scale, inputs in calls.items()}
    # Each encoder forward waits (at most 1 s) for the other thread to be inside one too: without the lock both
    # would run at once, each under the other's scale as well.
    meeting = threading.Barrier(2, timeout=1.0)
    forward = pipe.text_encoder.forward

    def meet_then_forward(*args, **kwargs):
        with contextlib.suppress(threading.BrokenBarrierError):
            meeting.wait()
        return forward(*args, **kwargs)

    pipe.text_encoder.forward = meet_then_forward
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = {scale: pool.submit(run, pipe, inputs) for scale, inputs in calls.items()}
            images = {scale: future.result() for scale, future in futures.items()}
    finally:
        del pipe.text_encoder.forward
    for scale in calls:
        assert same(images[scale], expected[scale])
    assert not same(expected[0.5], expected[1.3])
