"""Decoding: unpack the tokens by their position ids, undo the batch-norm normalization and the patches, decode."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from modular import BlockState, ComponentSpec, InputParam

from .utils import (
    IMAGE_PROCESSOR,
    MODEL_NAME,
    VAE,
    denormalize_latents,
    unpack_latents_with_ids,
    unpatchify_latents,
)

__all__ = ["Flux2DecodeStep"]


class Flux2DecodeStep(VaeDecodeStep):
    """Unpack and decode the latents with the VAE, then post-process them into images."""

    model_name = MODEL_NAME
    image_processor = IMAGE_PROCESSOR
    latents_description = "The denoised packed latents."

    description = (
        "Unpacks latents [B, tokens, C * 4] to [B, C * 4, h, w] by latent_ids, maps them back with the VAE's "
        "batch-norm statistics (x * std + mean), unpatchifies them to [B, C, 2h, 2w], decodes them with the VAE "
        "and post-processes them to output_type: 'pil', 'np' ([B, H, W, 3] in [0, 1]), 'pt' ([B, 3, H, W] in "
        "[0, 1]) or 'latent' (the packed latents, not decoded)."
    )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [VAE, self.image_processor]

    @property
    def extra_inputs(self) -> list[InputParam]:
        return [
            InputParam(
                "latent_ids", type_hint=torch.Tensor, required=True, description="Latent position ids."
            )
        ]

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        latents = unpack_latents_with_ids(block_state.latents, block_state.latent_ids)
        latents = unpatchify_latents(denormalize_latents(vae, latents))
        return vae.decode(latents.to(components._execution_device), return_dict=False)[0]
