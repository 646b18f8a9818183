"""Decoding: undo the latent normalization, VAE decode, and post-process to the requested output type."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import VaeDecodeStep
from blocks.common.vae import unscale_and_shift
from modular import BlockState, InputParam

from .image_encoders import PADDING_MASK_CROP
from .utils import IMAGE_PROCESSOR, MODEL_NAME

__all__ = ["SD3DecodeStep", "SD3InpaintDecodeStep"]


class SD3DecodeStep(VaeDecodeStep):
    """Decode latents with the VAE and post-process them into PIL images, numpy arrays or tensors."""

    model_name = MODEL_NAME
    image_processor = IMAGE_PROCESSOR

    description = (
        "Decodes latents / vae.config.scaling_factor + vae.config.shift_factor with the VAE and post-processes "
        "them to output_type: 'pil' (list of PIL images), 'np' (array [B, H, W, 3] in [0, 1]), 'pt' (tensor "
        "[B, 3, H, W] in [0, 1]) or 'latent' (the latents, not decoded)."
    )

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        return vae.decode(unscale_and_shift(vae, block_state.latents), return_dict=False)[0]


class SD3InpaintDecodeStep(SD3DecodeStep):
    """Inpainting's decode, as StableDiffusion3InpaintPipeline's: the latents over the scaling factor, without
    the shift, and with padding_mask_crop the result pasted back into the original image."""

    description = (
        "Decodes latents / vae.config.scaling_factor with the VAE (the classic inpainting pipeline adds no "
        "shift_factor here) and post-processes them to output_type; with padding_mask_crop, each 'pil' image "
        "is pasted over the original image inside the crop, through the mask."
    )

    @property
    def extra_inputs(self) -> list[InputParam]:
        return [
            PADDING_MASK_CROP,
            InputParam.template("image"),
            InputParam.template("mask_image"),
            InputParam(
                "crops_coords", type_hint=tuple, description="The crop of padding_mask_crop, or None."
            ),
        ]

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        vae = components.vae
        return vae.decode(block_state.latents / vae.config.scaling_factor, return_dict=False)[0]

    @torch.no_grad()
    def __call__(self, components, state):
        components, state = super().__call__(components, state)
        bs = self.get_block_state(state)
        if bs.padding_mask_crop is not None and bs.output_type == "pil":
            processor = components.image_processor
            images = [
                processor.apply_overlay(bs.mask_image, bs.image, image, bs.crops_coords)
                for image in state.get("images")
            ]
            state.set("images", images)
        return components, state
