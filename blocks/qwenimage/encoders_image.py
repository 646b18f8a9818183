"""Image-to-image and inpainting's image steps: the reference image to normalized VAE latents, and the mask to
packed latent tokens."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.params import BATCH_INPUTS, DTYPE, HEIGHT_WIDTH_OUTPUTS, tensor_output
from blocks.common.vae import processor_for_vae, sample_latents
from modular import ComponentSpec, InputParam, ModularPipelineBlocks

from .before_denoise import LATENTS
from .utils import (
    IMAGE_PROCESSOR,
    MODEL_NAME,
    VAE,
    default_size,
    image_processor_for_vae,
    latent_size,
    pack_latents,
    qwen_vae_scale_factor,
)

__all__ = [
    "MASK_PROCESSOR",
    "QwenImageVaeEncoderStep",
    "QwenImageInpaintVaeEncoderStep",
    "QwenImageInpaintMaskStep",
    "normalized_latents",
]

# The classic inpainting pipeline's mask processor: one channel, binarized, not normalized. Made from config;
# the step resizes with the loaded VAE's scale instead.
MASK_PROCESSOR = ComponentSpec(
    "mask_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={"vae_scale_factor": 16, "do_normalize": False, "do_binarize": True, "do_convert_grayscale": True},
    default_creation_method="from_config",
)


def normalized_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """VAE latents [B, C, 1, H, W] normalized as the classic image-to-image pipelines compute it:
    (latents - latents_mean) * (1 / latents_std)."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return (latents - mean) * inverse_std


class QwenImageVaeEncoderStep(ModularPipelineBlocks):
    """Image-to-image and inpainting: preprocess the reference image and encode it to normalized VAE latents."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` to height x width (1024 x 1024 by default: the image is resized, as in the classic "
        "pipelines), in [-1, 1], and encodes it with the VAE (a sample drawn with the generator; one generator "
        "per image for a list), normalized with latents_mean and latents_std: image_latents [images, C, 1, h, w]. "
        "An image of the VAE's latent channels is taken as latents. With given `latents` (image-to-image) the "
        "image is not encoded."
    )

    expected_components = [VAE, IMAGE_PROCESSOR]

    #: Whether given latents replace the image's (image-to-image); inpainting blends with them at every step.
    skips_with_latents = True

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("height"),
        InputParam.template("width"),
        LATENTS,
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [
        tensor_output("image_latents", "The image's normalized VAE latents [images, C, 1, h, w]."),
        tensor_output("processed_image", "The image preprocessed, [images, 3, H, W] in [-1, 1] (float32)."),
        *HEIGHT_WIDTH_OUTPUTS,
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        vae = components.vae
        bs.height, bs.width = default_size(components, bs.height, bs.width)
        processor = image_processor_for_vae(components)
        bs.processed_image = processor.preprocess(bs.image, height=bs.height, width=bs.width).to(
            torch.float32
        )
        bs.image_latents = None
        if bs.latents is None or not self.skips_with_latents:
            image = bs.processed_image.unsqueeze(2) if bs.processed_image.dim() == 4 else bs.processed_image
            image = image.to(device=components._execution_device, dtype=bs.dtype)
            if image.shape[1] == vae.config.z_dim:
                bs.image_latents = image
            else:
                bs.image_latents = normalized_latents(vae, sample_latents(vae, image, bs.generator))
        self.set_block_state(state, bs)
        return components, state


class QwenImageInpaintVaeEncoderStep(QwenImageVaeEncoderStep):
    """Inpainting: the reference image's latents, encoded even with given latents (they are blended in)."""

    skips_with_latents = False


class QwenImageInpaintMaskStep(ModularPipelineBlocks):
    """Inpainting: the mask, binarized, resized to the latents and packed like them (1: repaint, 0: keep)."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `mask_image` (grayscale, binarized: white is repainted) to height x width, resizes it to the "
        "latent size (nearest), repeats it to the batch and over the latent channels and packs it like the "
        "latents: mask [batch, tokens, C * 4]."
    )

    expected_components = [
        MASK_PROCESSOR,
        ComponentSpec("transformer", "diffusers.QwenImageTransformer2DModel"),
    ]

    inputs = [
        InputParam.template("mask_image", required=True),
        InputParam("height", type_hint=int, required=True, description="The image height in pixels."),
        InputParam("width", type_hint=int, required=True, description="The image width in pixels."),
        InputParam("batch_size", type_hint=int, required=True, description="Number of prompts."),
        InputParam.template("num_images_per_prompt"),
        DTYPE,
    ]

    intermediate_outputs = [tensor_output("mask", "The packed mask [batch, tokens, C * 4] (1: repaint).")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        settings: dict[str, Any] = {}
        if getattr(components, "vae", None) is not None:
            settings["vae_latent_channels"] = components.vae.config.z_dim
        processor = processor_for_vae(
            components.mask_processor, qwen_vae_scale_factor(components) * 2, **settings
        )
        mask = processor.preprocess(bs.mask_image, height=bs.height, width=bs.width)
        mask = torch.nn.functional.interpolate(mask, size=latent_size(components, bs.height, bs.width))
        mask = mask.to(device=components._execution_device, dtype=bs.dtype)
        total = bs.batch_size * bs.num_images_per_prompt
        if total % mask.shape[0] != 0:
            msg = (
                f"{type(self).__name__}: {mask.shape[0]} masks cannot be repeated to a batch of {total} (prompts x "
                "num_images_per_prompt); pass 1 mask or a number that divides the batch"
            )
            raise ValueError(msg)
        if mask.shape[0] < total:
            mask = mask.repeat(total // mask.shape[0], 1, 1, 1)
        channels = components.transformer.config.in_channels // 4
        bs.mask = pack_latents(mask.repeat(1, channels, 1, 1), channels)
        self.set_block_state(state, bs)
        return components, state
