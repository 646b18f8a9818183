"""Decoding: unpack the latents, undo the VAE scaling and shift, decode, post-process to the output type."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from blocks.common.vae import patched_latent_size, unscale_and_shift
from modular import BlockState, InputParam

from .utils import IMAGE_PROCESSOR, MODEL_NAME, default_size, unpack_latents

__all__ = ["FluxDecodeStep"]


class FluxDecodeStep(VaeDecodeStep):
    """Unpack and decode the latents with the VAE, then post-process them into images."""

    model_name = MODEL_NAME
    image_processor = IMAGE_PROCESSOR
    latents_description = "The denoised packed latents."

    description = (
        "Unpacks latents [B, tokens, C * 4] to [B, C, h, w], maps them back with latents / scaling_factor + "
        "shift_factor, decodes them with the VAE and post-processes them to output_type: 'pil', 'np' "
        "([B, H, W, 3] in [0, 1]), 'pt' ([B, 3, H, W] in [0, 1]) or 'latent' (the packed latents, not decoded)."
    )

    @property
    def extra_inputs(self) -> list[InputParam]:
        return [InputParam.template("height"), InputParam.template("width")]

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        height, width = default_size(components, block_state.height, block_state.width)
        latents = unpack_latents(block_state.latents, *patched_latent_size(components, height, width))
        return vae.decode(unscale_and_shift(vae, latents), return_dict=False)[0]
