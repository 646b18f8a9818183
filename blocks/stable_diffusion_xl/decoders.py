"""Decoding: VAE decode of the denoised latents (upcast when needed) and post-processing."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from blocks.stable_diffusion.encoders import IMAGE_PROCESSOR
from modular import BlockState

from .utils import MODEL_NAME, latents_stats, vae_in_float32

__all__ = ["StableDiffusionXLDecodeStep"]


class StableDiffusionXLDecodeStep(VaeDecodeStep):
    """Decode latents with the VAE and post-process them into PIL images, numpy arrays or tensors."""

    model_name = MODEL_NAME
    image_processor = IMAGE_PROCESSOR

    description = (
        "Un-normalizes the latents (by scaling_factor, and latents_mean / latents_std when the VAE has them), "
        "decodes them with the VAE, in float32 when the VAE is float16 and its config sets force_upcast "
        "(SDXL's VAE overflows in float16), and post-processes to output_type: 'pil', 'np', 'pt', or "
        "'latent' (the latents, not decoded)."
    )

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        latents = block_state.latents
        upcast = vae.dtype == torch.float16 and bool(getattr(vae.config, "force_upcast", False))
        with vae_in_float32(vae, upcast):
            latents = latents.to(vae.post_quant_conv.weight.dtype if upcast else latents.dtype)
            stats = latents_stats(vae, latents)
            if stats is None:
                latents = latents / vae.config.scaling_factor
            else:
                mean, std = stats
                latents = latents * std / vae.config.scaling_factor + mean
            return vae.decode(latents, return_dict=False)[0]
