"""The latent-to-RGB maps and the preview decoder's images (blocks/common/latent_preview.py)."""

import re
import types

import numpy as np
import pytest
import torch
from diffusers.models.autoencoders.vae import DecoderOutput

from blocks.common.latent_preview import (
    FLUX_LATENT_RGB,
    SD3_LATENT_RGB,
    SD_LATENT_RGB,
    SDXL_LATENT_RGB,
    Z_IMAGE_LATENT_RGB,
    LatentRGBMap,
    decoded_preview_images,
    rgb_images,
)

MAPS = [SD_LATENT_RGB, SDXL_LATENT_RGB, FLUX_LATENT_RGB, Z_IMAGE_LATENT_RGB, SD3_LATENT_RGB]


def _pixel(value: float) -> int:
    """The uint8 a preview shows for a map value: [-1, 1] to [0, 255], clipped, rounded."""
    return int(round((min(max(value, -1.0), 1.0) + 1.0) * 127.5))


@pytest.mark.parametrize("rgb_map", MAPS, ids=lambda rgb_map: rgb_map.name)
def test_a_latent_of_one_channel_shows_that_channel_s_colour(rgb_map):
    """A latent cell that is 1 in channel c and 0 elsewhere shows factors[c] + bias."""
    channels = rgb_map.channels
    latents = torch.eye(channels).reshape(1, channels, 1, channels)  # cell (0, c) is one-hot in channel c
    (image,) = rgb_map.images(latents)
    assert image.mode == "RGB" and image.size == (channels, 1)
    expected = [
        [_pixel(factor + bias) for factor, bias in zip(row, rgb_map.bias, strict=True)]
        for row in rgb_map.factors
    ]
    assert np.asarray(image)[0].tolist() == expected


def test_the_maps_have_the_channels_of_their_latent_spaces():
    """SD 1.x/2.x and SDXL read 4 channels, FLUX.1, Z-Image and SD3 16; each map says where its numbers come from."""
    assert [rgb_map.channels for rgb_map in MAPS] == [4, 4, 16, 16, 16]
    assert all("comfy/latent_formats.py" in rgb_map.source for rgb_map in MAPS)


def test_a_preview_draws_no_random_numbers_and_leaves_the_latents_as_they_were():
    """Making a preview changes neither the global random state nor the latents."""
    latents = torch.randn(2, 4, 8, 6, generator=torch.Generator().manual_seed(0))
    before, rng = latents.clone(), torch.get_rng_state()
    images = SDXL_LATENT_RGB.images(latents)
    assert torch.equal(latents, before) and torch.equal(torch.get_rng_state(), rng)
    assert [image.size for image in images] == [(6, 8), (6, 8)]


def test_rgb_values_are_clipped_to_the_image_range():
    """-1 is black, 1 is white, values beyond are clipped; 0 is mid-grey (127.5 rounded half to even)."""
    rgb = torch.tensor([-2.0, -1.0, 0.0, 1.0, 3.0]).reshape(1, 1, 1, 5).expand(1, 3, 1, 5)
    (image,) = rgb_images(rgb)
    assert np.asarray(image)[0, :, 0].tolist() == [0, 0, 128, 255, 255]


def test_latents_of_another_number_of_channels_are_refused():
    """A 4-channel map refuses 16-channel latents, naming the map, the shapes and the fix."""
    message = (
        "previews: the SDXL latent-to-RGB map takes latents [batch, 4, height, width], but this call's latents "
        "are [1, 16, 2, 2]; pass preview_decoder="
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        SDXL_LATENT_RGB.images(torch.zeros(1, 16, 2, 2))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"factors": ((1.0, 0.0),)}, "LatentRGBMap.factors must be one (R, G, B) row per latent channel"),
        ({"factors": ()}, "LatentRGBMap.factors must be one (R, G, B) row per latent channel"),
        ({"factors": ((1.0, 0.0, 0.0),), "bias": (0.0,)}, "LatentRGBMap.bias must be three numbers"),
    ],
)
def test_a_map_of_the_wrong_shape_cannot_be_made(fields, message):
    """Factors are (R, G, B) rows and the bias three numbers."""
    with pytest.raises(ValueError, match=re.escape(message)):
        LatentRGBMap("bad", **fields)


class _RecordingDecoder(torch.nn.Module):
    """A decoder that returns its input's first three channels and keeps what it was given."""

    def __init__(self, scaling_factor, shift_factor):
        super().__init__()
        self.config = types.SimpleNamespace(
            scaling_factor=scaling_factor, shift_factor=shift_factor, latent_channels=4
        )
        self.given = []

    def decode(self, latents):
        self.given.append(latents)
        return DecoderOutput(sample=latents[:, :3])


def test_a_preview_decoder_reads_the_latents_unscaled_and_shifted_as_its_config_says():
    """The decoder gets latents / scaling_factor + shift_factor (a missing shift counts as 0), and its output
    in [-1, 1] becomes one RGB image per latent."""
    latents = torch.full((2, 4, 3, 5), 0.5)
    decoder = _RecordingDecoder(scaling_factor=0.25, shift_factor=None)
    images = decoded_preview_images(decoder, latents)
    assert torch.equal(decoder.given[0], latents / 0.25)
    assert [image.size for image in images] == [(5, 3), (5, 3)]
    assert np.asarray(images[0])[0, 0].tolist() == [255, 255, 255]  # 2.0 clipped to white
    decoder = _RecordingDecoder(scaling_factor=2.0, shift_factor=-0.5)
    (image, _) = decoded_preview_images(decoder, latents)
    assert torch.equal(decoder.given[0], latents / 2.0 - 0.5)
    assert np.asarray(image)[0, 0].tolist() == [_pixel(-0.25)] * 3


def test_a_preview_decoder_gets_the_latents_where_it_runs():
    """An offload hook's execution device decides where the latents go (decode triggers the hook but moves no
    inputs); without a hook, where the decoder's weights are."""

    class HookedDecoder(_RecordingDecoder):
        def decode(self, latents):
            self.given.append(latents)
            return DecoderOutput(sample=torch.zeros(latents.shape[0], 3, *latents.shape[2:]))

    decoder = HookedDecoder(scaling_factor=1.0, shift_factor=0.0)
    decoder._hf_hook = types.SimpleNamespace(execution_device=torch.device("meta"))
    decoded_preview_images(decoder, torch.zeros(1, 4, 2, 2))
    assert decoder.given[0].device == torch.device("meta")
    decoder = HookedDecoder(scaling_factor=1.0, shift_factor=0.0)
    decoder.weight = torch.nn.Parameter(torch.zeros(1, device="meta"))
    decoded_preview_images(decoder, torch.zeros(1, 4, 2, 2))
    assert decoder.given[0].device == torch.device("meta")
