"""Decoding: VAE decode of the denoised latents and post-processing to the requested output type."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from modular import BlockState, InputParam

from .encoders import IMAGE_PROCESSOR
from .utils import MODEL_NAME

__all__ = ["StableDiffusionDecodeStep"]


class StableDiffusionDecodeStep(VaeDecodeStep):
    """Decode latents with the VAE and post-process them into PIL images, numpy arrays or tensors."""

    model_name = MODEL_NAME
    image_processor = IMAGE_PROCESSOR

    description = (
        "Decodes latents / vae.config.scaling_factor with the VAE and post-processes them to output_type: "
        "'pil' (list of PIL images), 'np' (array [B, H, W, 3] in [0, 1]), 'pt' (tensor [B, 3, H, W] in "
        "[0, 1]) or 'latent' (the latents, not decoded)."
    )

    @property
    def extra_inputs(self) -> list[InputParam]:
        return [InputParam.template("generator")]

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        latents = block_state.latents / vae.config.scaling_factor
        return vae.decode(latents, return_dict=False, generator=block_state.generator)[0]

    def postprocess(self, components: Any, image: torch.Tensor, output_type: str) -> Any:
        # No safety checker runs, so every image is denormalized from [-1, 1].
        return components.image_processor.postprocess(
            image, output_type=output_type, do_denormalize=[True] * image.shape[0]
        )
