"""Previews during a Stable Diffusion call: the family's latent-to-RGB map, a preview decoder under auto offload,
and the refusals that come before any model runs."""

import re

import numpy as np
import pytest
import torch

from blocks.common.latent_preview import SD_LATENT_RGB, decoded_preview_images
from blocks.stable_diffusion import StableDiffusionAutoBlocks
from modular import ComponentsManager
from offload import SimulatedDevice, module_nbytes

from ..helpers import (
    assert_identical,
    assert_previews_change_nothing,
    assert_previews_show_the_latents,
    forwards_of,
    make_image,
    make_mask,
    run_with_previews,
    tiny_preview_decoder,
)


def test_previews_leave_text_to_image_as_it_was(sd_pipe):
    """Previews every step and every 2 steps leave the images as they were; one 16x24 preview (the latents'
    size of a 32x48 image) per image, at the steps due."""
    assert_previews_change_nothing(
        sd_pipe, prompt="a cat", num_images_per_prompt=2, height=48, width=32, batch=2, size=(16, 24)
    )


def test_previews_leave_inpainting_with_a_9_channel_unet_as_it_was(sd_inpaint_pipe):
    """The inpainting UNet reads 9 channels, but the latents previewed are the 4 latent channels."""
    assert_previews_change_nothing(
        sd_inpaint_pipe, prompt="a cat", image=make_image(), mask_image=make_mask(), size=(32, 32)
    )


def test_a_preview_is_the_map_of_the_latents_after_its_step(sd_pipe):
    """Each preview is SD 1.x's latent-to-RGB map of the latents as that step left them."""
    assert_previews_show_the_latents(sd_pipe, SD_LATENT_RGB.images)


def _offloaded_pipe(repo):
    cm = ComponentsManager()
    pipe = StableDiffusionAutoBlocks().init_pipeline(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return cm, pipe


def test_a_preview_decoder_runs_through_the_manager_under_auto_offload(sd_repo):
    """Under auto offload on a device too small for the decoder beside the UNet and the text encoder, previews
    by a preview decoder leave the images as they were; the decoder is registered with the manager, placed by
    the engine (it forced an eviction, in the decision log and the offload record) and planned after the UNet."""
    cm, pipe = _offloaded_pipe(sd_repo)
    kwargs = {"prompt": "a cat", "num_inference_steps": 2, "output_type": "np"}
    expected, _ = run_with_previews(pipe, **kwargs)
    decoder = tiny_preview_decoder()
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    assert module_nbytes(decoder) > 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    plans = []
    set_plan = cm.set_execution_plan
    cm.set_execution_plan = lambda models: (plans.append(list(models)), set_plan(models))[1]
    images, previews = run_with_previews(pipe, 1, decoder=decoder, **kwargs)
    assert_identical(images, expected)
    assert plans == [[pipe.text_encoder, pipe.unet, decoder, pipe.vae]]
    decoder_id = cm.get_id(decoder)
    assert decoder_id is not None
    decisions = [entry for entry in cm.offload_log if entry.model_id == decoder_id]
    # It did not fit in the free bytes, and room was made for it (the strategy shrank the text encoder to a
    # resident prefix: an offload of the text encoder in the record), then it was copied over whole.
    first = decisions[0]
    assert first.free_before < module_nbytes(decoder) == first.bytes_to_device
    assert first.reason.startswith("evict:")
    events = list(cm.offload_record.events)
    onload = next(i for i, e in enumerate(events) if e.action == "onload" and e.model_id == decoder_id)
    assert events[onload - 1].action == "offload" and events[onload - 1].model_id == cm.get_id(
        pipe.text_encoder
    )
    # The tiny AutoencoderTiny doubles the size (32x32 latents, 64x64 previews); the same previews without offload.
    assert len(previews) == 3 and [image.size for image in previews[0].images] == [(64, 64)]
    cm.disable_auto_cpu_offload()
    _, plain = run_with_previews(pipe, 1, decoder=decoder, **kwargs)
    assert [np.asarray(p.images[0]).tolist() for p in previews] == [
        np.asarray(p.images[0]).tolist() for p in plain
    ]


def test_a_preview_decoder_the_manager_holds_is_used_as_it_is(sd_repo):
    """A decoder registered already (under a name of the user's) is not registered again."""
    cm, pipe = _offloaded_pipe(sd_repo)
    decoder = tiny_preview_decoder()
    decoder_id = cm.add("taesd", decoder)
    run_with_previews(pipe, 1, decoder=decoder, prompt="a cat", num_inference_steps=1)
    assert cm.get_id(decoder) == decoder_id
    assert [name for name in cm.components if name.startswith("preview_decoder")] == []


def test_the_decoder_previews_are_its_decode_of_the_latents(sd_pipe):
    """With a preview decoder each preview (every 2 steps) is the decoder's image of the step's latents
    (AutoencoderTiny's scaling factor 1 and shift 0: the latents as the UNet sees them)."""
    decoder = tiny_preview_decoder()
    assert_previews_show_the_latents(
        sd_pipe,
        lambda latents: decoded_preview_images(decoder, latents),
        every=2,
        decoder=decoder,
        num_inference_steps=3,
    )


@pytest.mark.parametrize(
    ("watch", "error", "message"),
    [
        ({"preview_every": 0}, ValueError, "preview_every must be 1 or more"),
        ({"preview_every": 1.5}, TypeError, "preview_every must be an int"),
        ({"on_preview": "show"}, TypeError, "on_preview must be callable"),
        ({"preview_decoder": "madebyollin/taesd"}, TypeError, "preview_decoder must be a torch.nn.Module"),
        ({"preview_decoder": torch.nn.Linear(4, 4)}, TypeError, "preview_decoder must be a torch.nn.Module"),
        (
            {"preview_decoder": tiny_preview_decoder(latent_channels=16)},
            ValueError,
            "AutoencoderTiny takes latents [batch, 16, height, width], but this pipeline's VAE makes latents of 4",
        ),
    ],
)
def test_bad_preview_values_raise_before_any_model_runs(sd_repo, watch, error, message):
    """A bad preview_every, on_preview or preview_decoder raises before any model runs and registers nothing."""
    cm, pipe = _offloaded_pipe(sd_repo)
    watch = {"on_preview": lambda preview: None, **watch}
    registered = set(cm.components)
    with (
        forwards_of(pipe.text_encoder, pipe.unet, pipe.vae) as forwards,
        pytest.raises(error, match=re.escape(message)),
    ):
        pipe(prompt="a cat", num_inference_steps=2, **watch)
    assert forwards == []
    assert set(cm.components) == registered


def test_removing_the_preview_decoder_waits_for_the_call_that_uses_it(sd_repo):
    """The call runs on its preview decoder as on its own models: a removal of the decoder from the manager in
    another thread waits until the call has ended, so no preview decodes with a model that is gone."""
    import threading

    cm, pipe = _offloaded_pipe(sd_repo)
    decoder = tiny_preview_decoder()
    in_preview, let_go, removed = threading.Event(), threading.Event(), threading.Event()
    order = []

    def on_preview(preview):
        in_preview.set()
        assert let_go.wait(30)
        order.append(f"preview {preview.step}")

    def call():
        pipe(
            prompt="a cat",
            num_inference_steps=2,
            output_type="latent",
            preview_decoder=decoder,
            on_preview=on_preview,
        )
        order.append("call ended")

    caller = threading.Thread(target=call)
    caller.start()
    assert in_preview.wait(60)
    decoder_id = cm.get_id(decoder)

    def remove():
        cm.remove(decoder_id)
        order.append("removed")
        removed.set()

    remover = threading.Thread(target=remove)
    remover.start()
    assert not removed.wait(0.5)  # still waiting for the call
    let_go.set()
    caller.join(60)
    remover.join(60)
    # The removal ended after the call's last preview (the call and the removal may then log in either order).
    assert order.index("removed") > order.index("preview 2")
    assert cm.get_id(decoder) is None
