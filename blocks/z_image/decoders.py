"""Decoding: undo the latent normalization, VAE decode, and post-process to the requested output type."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from blocks.common.vae import unscale_and_shift
from modular import BlockState

from .utils import IMAGE_PROCESSOR, MODEL_NAME

__all__ = ["ZImageDecodeStep"]


class ZImageDecodeStep(VaeDecodeStep):
    """Decode latents with the VAE and post-process them into PIL images, numpy arrays or tensors."""

    model_name = MODEL_NAME
    image_processor = IMAGE_PROCESSOR

    description = (
        "Decodes latents / vae.config.scaling_factor + vae.config.shift_factor with the VAE and "
        "post-processes them to output_type: 'pil' (list of PIL images), 'np' (array [B, H, W, 3] in "
        "[0, 1]), 'pt' (tensor [B, 3, H, W] in [0, 1]) or 'latent' (the latents, not decoded)."
    )

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        return vae.decode(unscale_and_shift(vae, block_state.latents.to(vae.dtype)), return_dict=False)[0]
