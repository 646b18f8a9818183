"""Helpers the Flux.2 blocks share: component specs, sizes, latent patches and packing, position ids, the
VAE's batch-norm latent normalization.

Flux.2 differs from FLUX.1 in the latent layout: the VAE's latents are patchified (each 2x2 patch of
C channels becomes 4C channels of one cell), normalized by the VAE's batch-norm statistics, and the
cells are packed row by row into tokens; position ids have four axes (T, H, W, L), where T tells the
generated image (0) from each reference image (10, 20, ...).
"""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.vae import processor_for_vae, vae_scale_factor
from modular import ComponentSpec, InputParam

__all__ = [
    "MODEL_NAME",
    "SCHEDULER",
    "TRANSFORMER",
    "VAE",
    "IMAGE_PROCESSOR",
    "DEFAULT_SAMPLE_SIZE",
    "LATENTS",
    "REFERENCE_TIME_STEP",
    "image_processor_for_vae",
    "default_size",
    "patchify_latents",
    "unpatchify_latents",
    "pack_latents",
    "unpack_latents_with_ids",
    "latent_ids",
    "reference_image_ids",
    "text_ids",
    "normalize_latents",
    "denormalize_latents",
]

MODEL_NAME = "flux2"

SCHEDULER = ComponentSpec(
    "scheduler",
    "diffusers.FlowMatchEulerDiscreteScheduler",
    description="The flow-matching Euler scheduler (Flux.2's empirical shift mu).",
)
TRANSFORMER = ComponentSpec("transformer", "diffusers.Flux2Transformer2DModel")
VAE = ComponentSpec("vae", "diffusers.AutoencoderKLFlux2")

# Made from config before the VAE is known, so the blocks resize with the loaded VAE's values
# (image_processor_for_vae), as the classic pipeline builds its processor from the VAE.
IMAGE_PROCESSOR = ComponentSpec(
    "image_processor",
    "diffusers.pipelines.flux2.image_processor.Flux2ImageProcessor",
    config={"vae_scale_factor": 16},
    default_creation_method="from_config",
)

# The classic pipeline's default size: 128 latent cells a side (1024 pixels with FLUX.2's 8x VAE).
DEFAULT_SAMPLE_SIZE = 128

# The T position of the i-th reference image's tokens is REFERENCE_TIME_STEP * (i + 1).
REFERENCE_TIME_STEP = 10

# Given latents are patchified but not packed: [B, C * 4, H / 2, W / 2] in latent cells.
LATENTS = InputParam.template("latents", note="patchified, [B, C * 4, h / 2, w / 2]")


def image_processor_for_vae(components: Any) -> Any:
    """The image processor, resizing to multiples of twice the loaded VAE's scale."""
    return processor_for_vae(components.image_processor, vae_scale_factor(components) * 2)


def default_size(components: Any, height: int | None, width: int | None) -> tuple[int, int]:
    """``height`` and ``width``, each defaulting to 128 latent cells in pixels, as the classic pipeline does."""
    pixels = DEFAULT_SAMPLE_SIZE * vae_scale_factor(components)
    return height or pixels, width or pixels


def patchify_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, C * 4, H / 2, W / 2]: each 2x2 patch becomes the channels of one cell."""
    batch, channels, height, width = latents.shape
    latents = latents.view(batch, channels, height // 2, 2, width // 2, 2)
    latents = latents.permute(0, 1, 3, 5, 2, 4)
    return latents.reshape(batch, channels * 4, height // 2, width // 2)


def unpatchify_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C * 4, H, W] -> [B, C, H * 2, W * 2], the inverse of patchify_latents."""
    batch, channels, height, width = latents.shape
    latents = latents.reshape(batch, channels // 4, 2, 2, height, width)
    latents = latents.permute(0, 1, 4, 2, 5, 3)
    return latents.reshape(batch, channels // 4, height * 2, width * 2)


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H * W, C]: one token per cell, row by row."""
    batch, channels, height, width = latents.shape
    return latents.reshape(batch, channels, height * width).permute(0, 2, 1)


def unpack_latents_with_ids(tokens: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[B, N, C] tokens -> [B, C, H, W]: each token goes to the (H, W) cell its position id names.

    H and W are one more than the largest row and column ids, as the classic pipeline computes them.
    """
    images = []
    for data, position in zip(tokens, ids):
        channels = data.shape[1]
        rows, columns = position[:, 1].to(torch.int64), position[:, 2].to(torch.int64)
        height, width = int(torch.max(rows)) + 1, int(torch.max(columns)) + 1
        out = torch.zeros((height * width, channels), device=data.device, dtype=data.dtype)
        out.scatter_(0, (rows * width + columns).unsqueeze(1).expand(-1, channels), data)
        images.append(out.view(height, width, channels).permute(2, 0, 1))
    return torch.stack(images, dim=0)


def _ids(t: torch.Tensor, height: int, width: int) -> torch.Tensor:
    return torch.cartesian_prod(t, torch.arange(height), torch.arange(width), torch.arange(1))


def latent_ids(batch: int, height: int, width: int) -> torch.Tensor:
    """Position ids [batch, height * width, 4] of the generated image's tokens: (0, row, column, 0)."""
    return _ids(torch.arange(1), height, width).unsqueeze(0).expand(batch, -1, -1)


def reference_image_ids(sizes: list[tuple[int, int]]) -> torch.Tensor:
    """Position ids [1, sum of h * w, 4] of the reference images' tokens, for their (h, w) cell sizes in order:
    (10 * (i + 1), row, column, 0) for the i-th image."""
    ids = [
        _ids(torch.tensor([REFERENCE_TIME_STEP * (index + 1)]), height, width)
        for index, (height, width) in enumerate(sizes)
    ]
    return torch.cat(ids, dim=0).unsqueeze(0)


def text_ids(batch: int, length: int) -> torch.Tensor:
    """Position ids [batch, length, 4] of the text tokens: (0, 0, 0, index)."""
    one = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length))
    return torch.stack([one] * batch)


def _batch_norm_stats(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Read through the VAE's state_dict, not its attributes: these buffers are used outside the VAE's forward,
    # and under auto offload with a host budget they are placeholders until the VAE runs; its state_dict reads
    # the real values back first.
    stats = vae.state_dict()
    mean = stats["bn.running_mean"].view(1, -1, 1, 1).to(like.device, like.dtype)
    std = torch.sqrt(stats["bn.running_var"].view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(
        like.device, like.dtype
    )
    return mean, std


def normalize_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Patchified VAE latents as the transformer reads them: (x - mean) / std of the VAE's batch norm."""
    mean, std = _batch_norm_stats(vae, latents)
    return (latents - mean) / std


def denormalize_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """The inverse of normalize_latents: x * std + mean, what the VAE decodes once unpatchified."""
    mean, std = _batch_norm_stats(vae, latents)
    return latents * std + mean
