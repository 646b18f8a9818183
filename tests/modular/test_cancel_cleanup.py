"""What a call stopped part way can leave behind, each checked: a cancel, a step callback's own error and a
KeyboardInterrupt unwind through the call's ``with`` blocks, so that LoRA scales, a guider's hooks, progress
bars, a streamed model's groups, the text encoder's lock and offload's running calls are all as after a call
that ended, and the next call's images equal the first call's."""

import logging

import pytest
import torch
from diffusers.guiders import SkipLayerGuidance
from diffusers.hooks import LayerSkipConfig
from tqdm.auto import tqdm

from modular import CallCancelled, CancelToken, ComponentsManager
from tests.blocks.helpers import hooked_modules

from .tiny_sd import tiny_sd_pipeline
from .watched_calls import (
    assert_left_clean,
    call_in_thread,
    joined,
    offload_on,
    run,
)

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made


class _Boom(Exception):
    pass


def _cancel_at(token, step):
    """An ``on_progress`` that cancels ``token`` once ``step`` steps are done."""

    def on_progress(event):
        if event.kind == "step" and event.step == step:
            token.cancel()

    return on_progress


def _raising_at(step, error):
    """A step callback that raises ``error`` after step ``step`` (0-based) and changes nothing before."""

    def callback(pipeline, step_index, timestep, callback_kwargs):
        if step_index == step:
            raise error
        return {}

    return callback


@pytest.mark.parametrize("mode", ["plain", "offload"])
@pytest.mark.parametrize(
    "error", [_Boom("the callback failed"), KeyboardInterrupt()], ids=["own", "interrupt"]
)
def test_a_step_callback_that_raises_leaves_the_call_as_a_cancel_does(repo, tmp_path, mode, error):
    """The callback's own exception (noted with the loop's name) or a KeyboardInterrupt goes through
    unchanged; nothing is left running and the next call equals the first."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    expected = run(pipe)
    offload_on(cm, pipe, mode, tmp_path)
    with pytest.raises(type(error)) as raised:
        run(pipe, callback_on_step_end=_raising_at(1, error))
    assert raised.value is error
    if isinstance(error, _Boom):
        assert any("raised in block 'denoise'" in note for note in error.__notes__)
    assert_left_clean(cm, pipe)
    assert torch.equal(run(pipe), expected)


def test_every_progress_bar_a_cancelled_call_opened_is_closed(repo):
    """The loop's tqdm bar is closed by the cancel (a bar left open would keep its line on the terminal)."""
    opened, closed = [], []

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

        def close(self):
            closed.append(self)
            super().close()

    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    pipe.set_progress_bar_config(tqdm_class=Bar, disable=True)
    token = CancelToken()
    with pytest.raises(CallCancelled):
        run(pipe, cancel=token, on_progress=_cancel_at(token, 1))
    assert len(opened) == 1
    assert closed and all(bar in closed for bar in opened)


@pytest.mark.parametrize("how", ["cancel", "interrupt"])
def test_a_call_stopped_in_a_loop_at_lora_scale_zero_keeps_the_adapters_weights(repo, lora, how):
    """At ``cross_attention_kwargs={"scale": 0.0}`` diffusers resets the UNet's LoRA layers after each forward;
    the loop puts back the weight ``set_adapters`` gave them even when a cancel or a KeyboardInterrupt from a
    step callback ends it: the next call at the adapter's weight equals the call before."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    pipe.load_lora_weights(lora, adapter_name="style")
    pipe.set_adapters(["style"], adapter_weights=[0.5])
    expected = run(pipe)
    token = CancelToken()
    stop = (
        {"cancel": token, "on_progress": _cancel_at(token, 1)}
        if how == "cancel"
        else {"callback_on_step_end": _raising_at(1, KeyboardInterrupt())}
    )
    with pytest.raises(CallCancelled if how == "cancel" else KeyboardInterrupt):
        run(pipe, cross_attention_kwargs={"scale": 0.0}, **stop)
    assert torch.equal(run(pipe), expected)


def test_an_interrupt_in_the_text_encoder_at_a_lora_scale_unscales_it_and_frees_its_lock(repo, lora):
    """A KeyboardInterrupt from inside the text encoder's forward at LoRA scale 0.5: its layers' scales are as
    before, and its lock (held while it encodes at a scale) is free: a call in another thread runs, and equals
    the call before."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    pipe.load_lora_weights(lora, adapter_name="style")
    expected = run(pipe)

    def interrupt(module, args):
        raise KeyboardInterrupt

    handle = pipe.text_encoder.register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(pipe, cross_attention_kwargs={"scale": 0.5})
    handle.remove()
    thread, outcome = call_in_thread(lambda: run(pipe))
    joined(thread)
    assert torch.equal(outcome["result"], expected)


def test_a_cancel_between_skip_layer_passes_leaves_no_guider_hook(repo):
    """A guider that hooks the UNet for its skip-layer pass (diffusers' SkipLayerGuidance): a KeyboardInterrupt
    inside that pass and a cancel mid-loop both leave no hook on the UNet, and the next call equals the first."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    config = LayerSkipConfig(
        indices=[0], fqn="mid_block.attentions.0.transformer_blocks", skip_attention=True
    )
    pipe.update_components(
        guider=SkipLayerGuidance(
            guidance_scale=5.0,
            skip_layer_guidance_scale=2.0,
            skip_layer_guidance_start=0.0,
            skip_layer_guidance_stop=1.0,
            skip_layer_config=config,
        )
    )
    expected = run(pipe)
    token = CancelToken()
    with pytest.raises(CallCancelled):
        run(pipe, cancel=token, on_progress=_cancel_at(token, 1))
    assert hooked_modules(pipe.unet) == []

    def interrupt_when_hooked(module, args):
        if hooked_modules(module):
            raise KeyboardInterrupt

    handle = pipe.unet.register_forward_pre_hook(interrupt_when_hooked)
    with pytest.raises(KeyboardInterrupt):
        run(pipe)
    handle.remove()
    assert hooked_modules(pipe.unet) == []
    assert torch.equal(run(pipe), expected)


def _latents(pipe):
    generator = torch.Generator().manual_seed(0)
    return pipe(
        prompt="a cat", num_inference_steps=3, generator=generator, output_type="latent", output="images"
    )


def _moves(log, since):
    return [(entry.model_id, entry.reason, entry.bytes_to_device) for entry in list(log)[since:]]


def test_an_interrupt_inside_a_streamed_forward_drops_its_streamed_groups(repo, tmp_path):
    """The UNet streams (it does not fit): a KeyboardInterrupt from one of its streamed blocks mid-forward ends
    the hooked call, whose groups streamed in are dropped: the UNet holds as much of itself as after a call that
    ended (latents out: the UNet runs last), the engine's totals equal its ledger, and the next call streams
    the same bytes as a call after a call that ended, and equals the first."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    expected = _latents(pipe)
    offload_on(cm, pipe, "stream", tmp_path)
    assert torch.equal(_latents(pipe), expected)
    engine, unet_id, log = cm.offload_engine, cm.get_id(pipe.unet), cm.offload_log
    after_a_call = (engine.residency(unet_id).resident_share, engine.probe.used_bytes())
    assert after_a_call[0] is not None and 0 < after_a_call[0] < 1  # partly resident
    since = len(log)
    assert torch.equal(_latents(pipe), expected)
    moves_after_a_call = _moves(log, since)
    assert ("unet" in unet_id) and any(reason == "stream tail" for _, reason, _ in moves_after_a_call)
    forwards = []

    def interrupt(module, args):  # in the second step, in a streamed group
        forwards.append(module)
        if len(forwards) == 2:
            raise KeyboardInterrupt

    handle = pipe.unet.up_blocks[1].register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        _latents(pipe)
    handle.remove()
    assert (engine.residency(unet_id).resident_share, engine.probe.used_bytes()) == after_a_call
    assert_left_clean(cm, pipe)
    since = len(log)
    assert torch.equal(_latents(pipe), expected)
    assert _moves(log, since) == moves_after_a_call
