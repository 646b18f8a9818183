"""Previews during a Qwen-Image call: Wan 2.1's latent-to-RGB map (Qwen-Image's VAE space) on the unpacked
latents, or a preview decoder; results left as they were."""

import pytest
import torch

from blocks.common.latent_preview import QWEN_IMAGE_LATENT_RGB, WAN21_LATENT_RGB
from blocks.qwenimage.denoise import (
    QwenImageDenoiseStep,
    QwenImageEditDenoiseStep,
    QwenImageInpaintDenoiseStep,
)
from modular.errors import PreviewUnavailableError

from ..helpers import assert_previews_change_nothing, tiny_preview_decoder
from .conftest import SIZE, make_image, make_mask


def test_qwen_image_previews_with_wan_2_1_s_latent_space():
    """Every Qwen-Image loop's map is Wan 2.1's numbers under its own name, for 16 latent channels."""
    for loop in (QwenImageDenoiseStep, QwenImageInpaintDenoiseStep, QwenImageEditDenoiseStep):
        assert loop.latent_rgb_map is QWEN_IMAGE_LATENT_RGB
    assert QWEN_IMAGE_LATENT_RGB.factors == WAN21_LATENT_RGB.factors
    assert QWEN_IMAGE_LATENT_RGB.channels == 16


def test_the_map_on_the_tiny_vae_is_refused_before_the_run(qwen_pipe):
    """The tiny VAE makes 4 latent channels: previews by the map are refused up front, naming the fix."""
    with pytest.raises(
        PreviewUnavailableError, match=r"Qwen-Image \(Wan 2.1's VAE\) latent-to-RGB map takes"
    ):
        qwen_pipe(
            prompt="a cat", height=SIZE, width=SIZE, num_inference_steps=2, preview_every=1, on_preview=print
        )


@pytest.mark.parametrize(
    "inputs",
    [
        {
            "prompt": "a cat",
            "negative_prompt": "blurry",
            "num_images_per_prompt": 2,
            "height": 48,
            "width": 32,
        },
        {"prompt": "a cat", "image": make_image(), "mask_image": make_mask(), "height": SIZE, "width": SIZE},
    ],
    ids=["text2image", "inpainting"],
)
def test_previews_with_a_decoder_leave_the_images_as_they_were(qwen_pipe, inputs):
    """A preview decoder's previews every step and every 2 steps leave the images as they were: one preview per
    image, twice the unpacked latents' size (6 x 4 latent cells for a 48 x 32 image)."""
    batch = inputs.get("num_images_per_prompt", 1)
    size = (8, 12) if inputs["height"] == 48 else (8, 8)
    decoder = tiny_preview_decoder(latent_channels=4)
    previews = assert_previews_change_nothing(qwen_pipe, batch=batch, size=size, decoder=decoder, **inputs)
    assert previews


def test_the_map_reads_the_unpacked_latents():
    """On 16-channel latents [B, 16, h, w] the map gives one RGB image of the latents' size per image."""
    images = QWEN_IMAGE_LATENT_RGB.images(torch.zeros(2, 16, 4, 6))
    assert [image.size for image in images] == [(6, 4), (6, 4)]
