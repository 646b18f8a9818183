"""Helpers the Flux blocks share: sizes, latent packing, image ids, the default sigmas."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from blocks.common.vae import processor_for_vae, vae_scale_factor
from modular import ComponentSpec, InputParam

__all__ = [
    "MODEL_NAME",
    "SCHEDULER",
    "IMAGE_PROCESSOR",
    "DEFAULT_SAMPLE_SIZE",
    "LATENTS",
    "image_processor_for_vae",
    "default_size",
    "default_sigmas",
    "pack_latents",
    "unpack_latents",
    "latent_image_ids",
    "transformer_channels_problem",
]

MODEL_NAME = "flux"

SCHEDULER = ComponentSpec(
    "scheduler",
    "diffusers.FlowMatchEulerDiscreteScheduler",
    description="The flow-matching Euler scheduler (resolution-dependent shift mu).",
)

# Flux packs 2x2 latent patches, so images are sized in multiples of twice the VAE scale: 16 for FLUX.1's
# 8x VAE with 16 latent channels. Made from config before the VAE is known, so the blocks resize with
# the loaded VAE's values instead (image_processor_for_vae), which the classic pipelines derive from it.
IMAGE_PROCESSOR = ComponentSpec(
    "image_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={"vae_scale_factor": 16, "vae_latent_channels": 16},
    default_creation_method="from_config",
)

# The classic pipelines' default size: 128 latent cells a side (1024 pixels with FLUX.1's VAE).
DEFAULT_SAMPLE_SIZE = 128

# Given latents are packed: each 2x2 patch of the VAE latents is one token.
LATENTS = InputParam.template("latents", note="packed, [B, tokens, C * 4]")


def image_processor_for_vae(components: Any) -> Any:
    """The image processor, sized for the loaded VAE: multiples of twice its scale, its latent channels."""
    settings = {}
    vae = getattr(components, "vae", None)
    if vae is not None:
        settings["vae_latent_channels"] = vae.config.latent_channels
    return processor_for_vae(components.image_processor, vae_scale_factor(components) * 2, **settings)


def default_size(components: Any, height: int | None, width: int | None) -> tuple[int, int]:
    """``height`` and ``width``, each defaulting to 128 latent cells in pixels, as the classic pipelines do."""
    pixels = DEFAULT_SAMPLE_SIZE * vae_scale_factor(components)
    return height or pixels, width or pixels


def default_sigmas(num_inference_steps: int) -> np.ndarray:
    """Evenly spaced sigmas from 1 down to 1 / steps, the classic pipelines' schedule before the shift."""
    return np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 * W/2, C * 4]: each 2x2 patch of the latents becomes one token."""
    batch, channels, height, width = latents.shape
    latents = latents.view(batch, channels, height // 2, 2, width // 2, 2)
    latents = latents.permute(0, 2, 4, 1, 3, 5)
    return latents.reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack_latents(latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, tokens, C * 4] -> [B, C, height, width] (latent height and width), the inverse of pack_latents."""
    batch, _, channels = latents.shape
    latents = latents.view(batch, height // 2, width // 2, channels // 4, 2, 2)
    latents = latents.permute(0, 3, 1, 4, 2, 5)
    return latents.reshape(batch, channels // 4, height, width)


def latent_image_ids(height: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Position ids [height * width, 3] of the packed tokens: (0, row, column), for the rotary embedding."""
    ids = torch.zeros(height, width, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(height)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(width)[None, :]
    return ids.reshape(height * width, 3).to(device=device, dtype=dtype)


def transformer_channels_problem(config: Any, inputs_per_latent: int) -> str | None:
    """What is wrong with a transformer that reads `inputs_per_latent` latents per token (2: control), or None."""
    out_channels = config.out_channels or config.in_channels
    if config.in_channels == out_channels * inputs_per_latent:
        return None
    kind, fix = (
        ("a control transformer", "pass control_image")
        if config.in_channels == 2 * out_channels
        else ("not a control transformer", "load a control transformer (e.g. FLUX.1-Canny-dev)")
    )
    return f"the transformer takes {config.in_channels} input channels for {out_channels} output channels, {kind}; {fix}"
