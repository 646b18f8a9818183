"""Helpers the Stable Diffusion XL blocks share: inputs declared once, VAE latent scaling, dtype upcasting."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from blocks.common.guidance import guidance_scale_of
from blocks.common.vae import sample_latents
from blocks.stable_diffusion.utils import guidance_scale_input as sd_guidance_scale_input
from modular import InputParam

__all__ = [
    "MODEL_NAME",
    "IMG2IMG_STRENGTH",
    "INPAINT_STRENGTH",
    "guidance_scale",
    "guidance_scale_input",
    "with_sdxl_guidance",
    "latents_stats",
    "vae_in_float32",
    "encode_image_latents",
]

MODEL_NAME = "stable-diffusion-xl"

# The classic pipelines' strength defaults: StableDiffusionXLImg2ImgPipeline's, and
# StableDiffusionXLInpaintPipeline's (just below 1, so the image's latents seed the noise).
IMG2IMG_STRENGTH = 0.3
INPAINT_STRENGTH = 0.9999


GUIDANCE_SCALE = 5.0  # the classic SDXL pipelines' default, and the default guider's


def guidance_scale_input() -> InputParam:
    """``guidance_scale``, defaulting to the guider's own (5.0 for SDXL's default guider)."""
    return sd_guidance_scale_input(GUIDANCE_SCALE)


def guidance_scale(components: Any, given: float | None) -> float:
    """The call's guidance scale: `given`, else the guider's own (``guidance_scale_of``)."""
    return guidance_scale_of(components, given, GUIDANCE_SCALE)


def with_sdxl_guidance(params: Iterable[InputParam]) -> list[InputParam]:
    """`params` (a Stable Diffusion block's inputs) with SDXL's ``guidance_scale`` in place of SD's."""
    return [guidance_scale_input() if p.name == "guidance_scale" else p for p in params]


def latents_stats(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The VAE's per-channel latents_mean and latents_std as [1, C, 1, 1] tensors like `like`, if it has both."""
    mean = getattr(vae.config, "latents_mean", None)
    std = getattr(vae.config, "latents_std", None)
    if mean is None or std is None:
        return None
    shape = (1, len(mean), 1, 1)
    return (
        torch.tensor(mean).view(shape).to(like.device, like.dtype),
        torch.tensor(std).view(shape).to(like.device, like.dtype),
    )


@contextlib.contextmanager
def vae_in_float32(vae: Any, upcast: bool) -> Iterator[None]:
    """Run the VAE in float32 when `upcast` (SDXL's VAE overflows in float16), restoring its dtype after."""
    original = vae.dtype
    # A float32 VAE is left alone (moving it would only log diffusers' casting warning).
    upcast = upcast and original != torch.float32
    if upcast:
        vae.to(dtype=torch.float32)
    try:
        yield
    finally:
        if upcast:
            vae.to(dtype=original)


def encode_image_latents(
    vae: Any, image: torch.Tensor, generator: torch.Generator | list[torch.Generator] | None
) -> torch.Tensor:
    """Encode pixel images [B, 3, H, W] in [-1, 1] to normalized latents, in the image's dtype.

    With ``vae.config.force_upcast`` the encoding runs in float32. A list of generators samples image
    ``i`` with ``generator[i]``. Latents are scaled by ``scaling_factor`` (and shifted by the VAE's
    latents_mean / latents_std when its config has them).
    """
    dtype = image.dtype
    upcast = bool(getattr(vae.config, "force_upcast", False))
    with vae_in_float32(vae, upcast):
        latents = sample_latents(vae, image.float() if upcast else image, generator)
    latents = latents.to(dtype)
    stats = latents_stats(vae, latents)
    if stats is None:
        return vae.config.scaling_factor * latents
    mean, std = stats
    return (latents - mean) * vae.config.scaling_factor / std
