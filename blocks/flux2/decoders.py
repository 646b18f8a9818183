"""Decoding: unpack the tokens by their position ids, undo the batch-norm normalization and the patches, decode."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from modular import BlockState, ComponentSpec, InputParam, PipelineState

from .utils import (
    IMAGE_PROCESSOR,
    MODEL_NAME,
    VAE,
    denormalize_latents,
    unpack_latents_with_ids,
    unpatchify_latents,
)

__all__ = ["Flux2DecodeStep", "Flux2KleinDecodeStep"]


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

    @staticmethod
    def vae_latents(components: Any, block_state: BlockState) -> torch.Tensor:
        """The packed latents as the VAE decodes them: unpacked, denormalized, unpatchified, [B, C, H, W]."""
        latents = unpack_latents_with_ids(block_state.latents, block_state.latent_ids)
        return unpatchify_latents(denormalize_latents(components.vae, latents))

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        latents = self.vae_latents(components, block_state).to(components._execution_device)
        return components.vae.decode(latents, return_dict=False)[0]


class Flux2KleinDecodeStep(Flux2DecodeStep):
    """Klein's decoding: as Flux.2's, but ``output_type="latent"`` gives the VAE's latents, as its classic
    pipeline does."""

    description = (
        "Unpacks latents [B, tokens, C * 4] by latent_ids, maps them back with the VAE's batch-norm statistics "
        "and unpatchifies them to [B, C, 2h, 2w]; output_type 'latent' returns those, others decode them with "
        "the VAE and post-process them: 'pil', 'np' ([B, H, W, 3] in [0, 1]) or 'pt' ([B, 3, H, W] in [0, 1])."
    )

    @torch.no_grad()
    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        if block_state.output_type != "latent":
            return super().__call__(components, state)
        block_state.images = self.vae_latents(components, block_state)
        self.set_block_state(state, block_state)
        return components, state
