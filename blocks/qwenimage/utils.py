"""Helpers the Qwen-Image blocks share: component specs, the VAE's scale, sizes, latent packing, guidance."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from blocks.common.guidance import guider_spec
from blocks.common.vae import processor_for_vae
from modular import ComponentSpec, InputParam

__all__ = [
    "MODEL_NAME",
    "SCHEDULER",
    "TRANSFORMER",
    "VAE",
    "IMAGE_PROCESSOR",
    "GUIDER_SPEC",
    "TRUE_CFG_SCALE",
    "DEFAULT_SAMPLE_SIZE",
    "MAX_SEQUENCE_LENGTH",
    "qwen_vae_scale_factor",
    "image_processor_for_vae",
    "default_size",
    "floor_to_multiple",
    "default_sigmas",
    "pack_latents",
    "unpack_latents",
    "latent_size",
    "true_cfg_scale",
    "true_cfg_scale_input",
    "guidance_on",
    "embeds_input",
    "mask_input",
]

MODEL_NAME = "qwen-image"

SCHEDULER = ComponentSpec(
    "scheduler",
    "diffusers.FlowMatchEulerDiscreteScheduler",
    description="The flow-matching Euler scheduler (shifted by the image's sequence length, mu).",
)
TRANSFORMER = ComponentSpec("transformer", "diffusers.QwenImageTransformer2DModel")
VAE = ComponentSpec("vae", "diffusers.AutoencoderKLQwenImage")

# Qwen-Image packs 2x2 latent patches, so images are sized in multiples of twice the VAE scale (16 for the
# real 8x VAE). Made from config before the VAE is known, so the blocks resize with the loaded VAE's scale
# instead (image_processor_for_vae), as the classic pipelines build theirs from the VAE.
IMAGE_PROCESSOR = ComponentSpec(
    "image_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={"vae_scale_factor": 16},
    default_creation_method="from_config",
)

TRUE_CFG_SCALE = 4.0  # the classic pipelines' default true_cfg_scale
# The classic guidance: neg + scale * (pos - neg), which is ClassifierFreeGuidance in its default
# (Imagen) formulation; the classic pipelines then rescale it to the positive prediction's norm per token.
GUIDER_SPEC = guider_spec(guidance_scale=TRUE_CFG_SCALE)

DEFAULT_SAMPLE_SIZE = 128  # latent cells a side: 1024 pixels with the real VAE
MAX_SEQUENCE_LENGTH = 1024  # the most prompt tokens the classic pipelines take


def qwen_vae_scale_factor(components: Any) -> int:
    """Pixels per latent cell: 2 per temporal-downsample entry of the VAE, as the classic pipelines count
    (8 with no VAE loaded)."""
    vae = getattr(components, "vae", None)
    if vae is None:
        return 8
    return 2 ** len(vae.config.temperal_downsample)


def image_processor_for_vae(components: Any) -> Any:
    """The image processor, resizing to multiples of twice the loaded VAE's scale, as the classic pipelines."""
    return processor_for_vae(components.image_processor, qwen_vae_scale_factor(components) * 2)


def default_size(components: Any, height: int | None, width: int | None) -> tuple[int, int]:
    """``height`` and ``width``, each defaulting to 128 latent cells in pixels (1024), as the classic pipeline."""
    pixels = DEFAULT_SAMPLE_SIZE * qwen_vae_scale_factor(components)
    return height or pixels, width or pixels


def floor_to_multiple(components: Any, height: int, width: int) -> tuple[int, int]:
    """Height and width rounded down to multiples of twice the VAE scale (the edit pipeline rounds so)."""
    multiple = qwen_vae_scale_factor(components) * 2
    return height // multiple * multiple, width // multiple * multiple


def latent_size(components: Any, height: int, width: int) -> tuple[int, int]:
    """The latent height and width of an image: over the VAE scale, rounded down to even (whole 2x2 patches)."""
    patch = qwen_vae_scale_factor(components) * 2
    return 2 * (int(height) // patch), 2 * (int(width) // patch)


def default_sigmas(num_inference_steps: int) -> np.ndarray:
    """Evenly spaced sigmas from 1 down to 1 / steps, the classic pipelines' schedule before the shift."""
    return np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)


def pack_latents(latents: torch.Tensor, channels: int) -> torch.Tensor:
    """Latents of one frame, [B, C, 1, H, W] (or the noise's [B, 1, C, H, W]) -> [B, H/2 * W/2, C * 4] tokens:
    each 2x2 patch becomes one token, by the classic pipeline's own packing."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import QwenImagePipeline

    batch, height, width = latents.shape[0], latents.shape[-2], latents.shape[-1]
    return QwenImagePipeline._pack_latents(latents, batch, channels, height, width)


def unpack_latents(components: Any, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Packed tokens [B, seq, C * 4] of a `height` x `width` image -> VAE latents [B, C, 1, H, W]."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import QwenImagePipeline

    return QwenImagePipeline._unpack_latents(latents, height, width, qwen_vae_scale_factor(components))


def true_cfg_scale_input() -> InputParam:
    """``true_cfg_scale``: the classic pipelines' classifier-free guidance scale, on with a negative prompt."""
    return InputParam(
        "true_cfg_scale",
        type_hint=float,
        default=None,
        description=(
            "Classifier-free guidance scale: pred = neg + scale * (pos - neg), rescaled to the positive "
            "prediction's norm; on when above 1 and a negative prompt (or its embeddings) is given. Default: the "
            f"guider's own ({TRUE_CFG_SCALE} for the default guider); a value given here holds for this call only."
        ),
    )


def true_cfg_scale(components: Any, given: float | None) -> float:
    """The call's true CFG scale: `given`, else the guider's own, else 4.0 (blocks run without a guider).

    Not ``guidance_scale_of``: a step callback's ``pipeline._guidance_scale`` is the classic pipelines'
    embedded guidance (``guidance_scale``), read once before the loop; it never sets ``true_cfg_scale``."""
    if given is not None:
        return given
    scale = getattr(getattr(components, "guider", None), "guidance_scale", None)
    return TRUE_CFG_SCALE if scale is None else scale


def guidance_on(scale: float, has_negative: bool) -> bool:
    """The classic rule: true classifier-free guidance runs for a scale above 1 with a negative prompt."""
    return scale > 1 and has_negative


def embeds_input(name: str, required: bool = False) -> InputParam:
    """``prompt_embeds`` / ``negative_prompt_embeds``: [batch, seq_len, dim], padded to the longest prompt."""
    return InputParam.template(name, "[batch, seq_len, dim], padding marked by the mask", required=required)


def mask_input(name: str) -> InputParam:
    """``prompt_embeds_mask`` / ``negative_prompt_embeds_mask``: 1 for real tokens, 0 for padding."""
    return InputParam(
        name,
        type_hint=torch.Tensor,
        description=(
            f"[batch, seq_len] mask of {name.removesuffix('_mask')} (1: a token, 0: padding); None: every "
            "token counts."
        ),
    )
