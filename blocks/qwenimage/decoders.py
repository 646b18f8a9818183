"""Decoding: unpack the latents, undo the latent normalization, decode the one frame, post-process."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from modular import BlockState, ComponentSpec, InputParam

from .utils import IMAGE_PROCESSOR, MODEL_NAME, VAE, default_size, image_processor_for_vae, unpack_latents

__all__ = ["QwenImageDecodeStep", "denormalized"]


def denormalized(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """VAE latents [B, C, 1, H, W] from the transformer's normalized ones, as the classic pipelines compute it:
    latents / (1 / latents_std) + latents_mean."""
    config = vae.config
    shape = (1, config.z_dim, 1, 1, 1)
    mean = torch.tensor(config.latents_mean).view(shape).to(latents.device, latents.dtype)
    inverse_std = 1.0 / torch.tensor(config.latents_std).view(shape).to(latents.device, latents.dtype)
    return latents / inverse_std + mean


class QwenImageDecodeStep(VaeDecodeStep):
    """Unpack and decode the latents with the VAE, then post-process them into images."""

    model_name = MODEL_NAME
    image_processor = IMAGE_PROCESSOR
    latents_description = "The denoised packed latents."

    description = (
        "Unpacks latents [B, tokens, C * 4] to the VAE's [B, C, 1, h, w], undoes the normalization (latents_mean, "
        "latents_std), decodes the one frame and post-processes it to output_type: 'pil', 'np' ([B, H, W, 3] in "
        "[0, 1]), 'pt' ([B, 3, H, W] in [0, 1]) or 'latent' (the packed latents, not decoded)."
    )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [VAE, self.image_processor]

    @property
    def extra_inputs(self) -> list[InputParam]:
        return [InputParam.template("height"), InputParam.template("width")]

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        height, width = default_size(components, block_state.height, block_state.width)
        latents = unpack_latents(components, block_state.latents, height, width).to(vae.dtype)
        return vae.decode(denormalized(vae, latents), return_dict=False)[0][:, :, 0]

    def postprocess(self, components: Any, image: torch.Tensor, output_type: str) -> Any:
        return image_processor_for_vae(components).postprocess(image, output_type=output_type)
