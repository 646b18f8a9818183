"""Previews of the image being denoised: a family's linear latent-to-RGB map, or a small decoder's output.

A preview is one RGB ``PIL.Image.Image`` per image of the batch. Made by a :class:`LatentRGBMap` it has the
latents' own size (one pixel per latent cell: 64x64 for a 512x512 SD image, cheap enough for every step; resize
it for show); made by a preview decoder (diffusers' ``AutoencoderTiny``) it has the decoder's output size.
Neither draws random numbers nor writes to the latents, so a call's result is the same with or without previews.

The maps' numbers are the per-channel colour of each latent space, fitted by ComfyUI and published in
``comfy/latent_formats.py`` (``latent_rgb_factors`` and ``latent_rgb_factors_bias``; read at commit
040a3243468ecefd1f2802592d90458f1ce4d65f of github.com/comfyanonymous/ComfyUI). They act on the latents as the
denoiser sees them (ComfyUI's previews read the sampler's latents after its ``process_in`` scaling, which is
what the diffusers pipelines denoise too) and give RGB in about [-1, 1].
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import PIL.Image
import torch

from modular.errors import PreviewUnavailableError

__all__ = [
    "FLUX_LATENT_RGB",
    "SDXL_LATENT_RGB",
    "SD3_LATENT_RGB",
    "SD_LATENT_RGB",
    "Z_IMAGE_LATENT_RGB",
    "LatentRGBMap",
    "check_latent_channels",
    "decoded_preview_images",
    "rgb_images",
]


def _rows_of_three(instance: Any, attribute: attrs.Attribute, rows: tuple[tuple[float, ...], ...]) -> None:
    if not rows or any(len(row) != 3 for row in rows):
        msg = f"LatentRGBMap.{attribute.name} must be one (R, G, B) row per latent channel (got {rows!r})"
        raise ValueError(msg)


def _three(instance: Any, attribute: attrs.Attribute, bias: tuple[float, ...]) -> None:
    if len(bias) != 3:
        msg = f"LatentRGBMap.{attribute.name} must be three numbers, (R, G, B) (got {bias!r})"
        raise ValueError(msg)


@attrs.frozen
class LatentRGBMap:
    """A linear map from a latent space to RGB: ``rgb = latents @ factors + bias`` per latent cell.

    Attributes:
        name: the latent space it maps ("Stable Diffusion 1.x/2.x", ...), named in errors.
        factors: one (R, G, B) row per latent channel.
        bias: the (R, G, B) added to every cell.
        source: where the numbers come from.
    """

    name: str
    factors: tuple[tuple[float, float, float], ...] = attrs.field(validator=_rows_of_three)
    bias: tuple[float, float, float] = attrs.field(default=(0.0, 0.0, 0.0), validator=_three)
    source: str = ""

    @property
    def channels(self) -> int:
        """The number of latent channels the map reads."""
        return len(self.factors)

    def rgb(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, H, W] -> RGB [B, 3, H, W] (float32, about [-1, 1]); ``latents`` is left as it was.

        Raises:
            ValueError: the latents do not have the map's number of channels.
        """
        check_latent_channels(latents, self.channels, f"the {self.name} latent-to-RGB map")
        factors = torch.tensor(self.factors, dtype=torch.float32, device=latents.device)
        bias = torch.tensor(self.bias, dtype=torch.float32, device=latents.device)
        return torch.einsum("bchw,cr->brhw", latents.float(), factors) + bias[:, None, None]

    def images(self, latents: torch.Tensor) -> list[PIL.Image.Image]:
        """One RGB ``PIL.Image.Image`` per image of the batch, at the latents' size (W x H)."""
        return rgb_images(self.rgb(latents))


def check_latent_channels(latents: torch.Tensor | int, channels: int | None, reader: str) -> None:
    """Raises ValueError when ``latents`` [B, C, H, W] (or the loaded VAE's latent channels, an int) do not have
    the ``channels`` that ``reader`` takes (``None``: any number)."""
    if isinstance(latents, int):
        if channels is None or latents == channels:
            return
        have = f"this pipeline's VAE makes latents of {latents} channels"
    elif latents.ndim == 4 and (channels is None or latents.shape[1] == channels):
        return
    else:
        have = f"this call's latents are {list(latents.shape)}"
    msg = (
        f"previews: {reader} takes latents [batch, {channels}, height, width], but {have}; pass "
        "preview_decoder= a decoder of this latent space (e.g. an AutoencoderTiny)"
    )
    raise PreviewUnavailableError(msg)


def rgb_images(rgb: torch.Tensor) -> list[PIL.Image.Image]:
    """RGB [B, 3, H, W] in [-1, 1] -> one ``PIL.Image.Image`` per image (values outside are clipped)."""
    pixels = ((rgb.detach().float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    array = pixels.permute(0, 2, 3, 1).cpu().numpy()
    return [PIL.Image.fromarray(np.ascontiguousarray(image), mode="RGB") for image in array]


def decoded_preview_images(decoder: Any, latents: torch.Tensor) -> list[PIL.Image.Image]:
    """The preview ``decoder``'s images of ``latents`` [B, C, H, W], one ``PIL.Image.Image`` per image.

    The decoder reads ``latents / scaling_factor + shift_factor`` of its own config, as a family's VAE does:
    diffusers' ``AutoencoderTiny`` (TAESD, TAESDXL, TAEF1) has 1 and 0 there and so decodes the denoiser's
    latents as they are; a full VAE passed as the preview decoder unscales them as the decode step does.

    Raises:
        ValueError: the latents do not have the decoder's ``latent_channels``.
    """
    config = decoder.config
    check_latent_channels(latents, getattr(config, "latent_channels", None), type(decoder).__name__)
    dtype = getattr(decoder, "dtype", None) or latents.dtype
    shift = getattr(config, "shift_factor", None) or 0.0
    latents = latents.to(device=_device_of(decoder, latents.device), dtype=dtype)
    image = decoder.decode(latents / config.scaling_factor + shift).sample
    return rgb_images(image)


def _device_of(decoder: Any, default: torch.device) -> torch.device:
    """Where ``decoder`` runs: an offload hook's execution device (its ``decode`` triggers the hook but gets no
    inputs moved), else where its weights are."""
    hook_device = getattr(getattr(decoder, "_hf_hook", None), "execution_device", None)
    if hook_device is not None:
        return torch.device(hook_device)
    weight = next(iter(decoder.parameters()), None)
    return default if weight is None else weight.device


# ----- the families' maps -----

_COMFY = "ComfyUI comfy/latent_formats.py"

#: Stable Diffusion 1.x and 2.x share one VAE and so one latent space (ComfyUI's ``SD15``; its ``SD20`` reuses it).
SD_LATENT_RGB = LatentRGBMap(
    "Stable Diffusion 1.x/2.x",
    factors=(
        (0.3512, 0.2297, 0.3227),
        (0.3250, 0.4974, 0.2350),
        (-0.2829, 0.1762, 0.2721),
        (-0.2120, -0.2616, -0.7177),
    ),
    source=f"{_COMFY}, SD15.latent_rgb_factors",
)

#: SDXL's VAE (ComfyUI's ``SDXL``): 4 channels, another latent space than SD 1.x's.
SDXL_LATENT_RGB = LatentRGBMap(
    "SDXL",
    factors=(
        (0.3651, 0.4232, 0.4341),
        (-0.2533, -0.0042, 0.1068),
        (0.1076, 0.1111, -0.0362),
        (-0.3165, -0.2492, -0.2188),
    ),
    bias=(0.1084, -0.0175, -0.0011),
    source=f"{_COMFY}, SDXL.latent_rgb_factors and latent_rgb_factors_bias",
)

#: FLUX.1's 16-channel VAE (ComfyUI's ``Flux``), on the unpacked latents [B, 16, H, W].
FLUX_LATENT_RGB = LatentRGBMap(
    "FLUX.1",
    factors=(
        (-0.0346, 0.0244, 0.0681),
        (0.0034, 0.0210, 0.0687),
        (0.0275, -0.0668, -0.0433),
        (-0.0174, 0.0160, 0.0617),
        (0.0859, 0.0721, 0.0329),
        (0.0004, 0.0383, 0.0115),
        (0.0405, 0.0861, 0.0915),
        (-0.0236, -0.0185, -0.0259),
        (-0.0245, 0.0250, 0.1180),
        (0.1008, 0.0755, -0.0421),
        (-0.0515, 0.0201, 0.0011),
        (0.0428, -0.0012, -0.0036),
        (0.0817, 0.0765, 0.0749),
        (-0.1264, -0.0522, -0.1103),
        (-0.0280, -0.0881, -0.0499),
        (-0.1262, -0.0982, -0.0778),
    ),
    bias=(-0.0329, -0.0718, -0.0851),
    source=f"{_COMFY}, Flux.latent_rgb_factors and latent_rgb_factors_bias",
)

#: Stable Diffusion 3 / 3.5's 16-channel VAE (ComfyUI's ``SD3``), another latent space than FLUX.1's.
SD3_LATENT_RGB = LatentRGBMap(
    "Stable Diffusion 3",
    factors=(
        (-0.0922, -0.0175, 0.0749),
        (0.0311, 0.0633, 0.0954),
        (0.1994, 0.0927, 0.0458),
        (0.0856, 0.0339, 0.0902),
        (0.0587, 0.0272, -0.0496),
        (-0.0006, 0.1104, 0.0309),
        (0.0978, 0.0306, 0.0427),
        (-0.0042, 0.1038, 0.1358),
        (-0.0194, 0.0020, 0.0669),
        (-0.0488, 0.0130, -0.0268),
        (0.0922, 0.0988, 0.0951),
        (-0.0278, 0.0524, -0.0542),
        (0.0332, 0.0456, 0.0895),
        (-0.0069, -0.0030, -0.0810),
        (-0.0596, -0.0465, -0.0293),
        (-0.1448, -0.1463, -0.1189),
    ),
    bias=(0.2394, 0.2135, 0.1925),
    source=f"{_COMFY}, SD3.latent_rgb_factors and latent_rgb_factors_bias",
)

#: Z-Image decodes with FLUX.1's VAE (Z-Image-Turbo's vae/config.json: 16 latent channels, scaling 0.3611, shift
#: 0.1159, as FLUX.1-dev's), so its latents live in FLUX.1's space; ComfyUI's ``ZImage`` model (a ``Lumina2``)
#: uses ``latent_formats.Flux`` too (comfy/supported_models.py). Unlike Flux, Z-Image's latents are not packed.
Z_IMAGE_LATENT_RGB = attrs.evolve(FLUX_LATENT_RGB, name="Z-Image (FLUX.1's VAE)")
