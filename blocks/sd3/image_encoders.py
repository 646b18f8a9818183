"""Image encoder steps: the reference image for image-to-image, the image and mask for inpainting."""

from __future__ import annotations

import torch

from blocks.common.batch import check_generators
from blocks.common.params import BATCH_INPUTS, DTYPE, tensor_input, tensor_output
from blocks.common.vae import encode_shifted_latents
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    IMAGE_PROCESSOR,
    MASK_PROCESSOR,
    MODEL_NAME,
    default_size,
    image_processor_for_vae,
    mask_processor_for_vae,
)

__all__ = ["MASKED_IMAGE_LATENTS", "PADDING_MASK_CROP", "SD3VaeEncoderStep", "SD3InpaintVaeEncoderStep"]

_VAE = ComponentSpec("vae", "diffusers.AutoencoderKL")

MASKED_IMAGE_LATENTS = tensor_input(
    "masked_image_latents",
    "Latents of the masked image [N, C, h, w] (shifted and scaled like encoded ones); default: encoded from "
    "image and mask_image.",
)
PADDING_MASK_CROP = InputParam(
    "padding_mask_crop",
    type_hint=int,
    description=(
        "Margin in pixels around the masked area: image and mask are cropped to it (at the image's aspect "
        "ratio), inpainted, and pasted back into the original image ('pil' output). Default: no crop."
    ),
)


def _encode(vae, image: torch.Tensor, generator) -> torch.Tensor:
    """Latents of `image`, or `image` itself when it has the VAE's latent channels already."""
    if image.shape[1] == vae.config.latent_channels:
        return image
    return encode_shifted_latents(vae, image, generator)


class SD3VaeEncoderStep(ModularPipelineBlocks):
    """Image-to-image: preprocess the reference image to height x width and encode it to SD3 latents."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` to height x width (default: the transformer's sample size in pixels) in [-1, 1] "
        "and encodes it with the VAE into image_latents, (sample - shift_factor) * scaling_factor. A tensor "
        "with the VAE's latent channels is taken as latents already; with given `latents` nothing is encoded."
    )

    expected_components = [_VAE, IMAGE_PROCESSOR]

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("height"),
        InputParam.template("width"),
        InputParam.template("latents"),
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [
        tensor_output("image_latents", "VAE latents of the image; None when latents are given.")
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        image = image_processor_for_vae(components).preprocess(block_state.image, height=height, width=width)
        image_latents = None
        if block_state.latents is None:
            check_generators(
                self, block_state.generator, block_state.batch_size * block_state.num_images_per_prompt
            )
            vae = components.vae
            image = image.to(device=components._execution_device, dtype=block_state.dtype)
            image_latents = _encode(vae, image, block_state.generator)
        block_state.image_latents = image_latents
        self.set_block_state(state, block_state)
        return components, state


class SD3InpaintVaeEncoderStep(ModularPipelineBlocks):
    """Inpainting: preprocess image and mask, encode the image where it is needed, make the masked image."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` (to height x width, in [-1, 1]) and `mask_image` (grayscale, binarized; white is "
        "repainted), both first cropped to the masked area plus padding_mask_crop when given. Encodes the image "
        "into image_latents when the denoising needs them (a transformer that reads the latents alone pastes "
        "back the unmasked area; strength below 1 starts from the noised image). masked_image is the image with "
        "the masked area zeroed, or the given masked_image_latents."
    )

    expected_components = [_VAE, IMAGE_PROCESSOR, MASK_PROCESSOR]

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("mask_image", required=True),
        MASKED_IMAGE_LATENTS,
        PADDING_MASK_CROP,
        InputParam.template("height"),
        InputParam.template("width"),
        InputParam.template("latents"),
        InputParam.template("strength", default=0.6),
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [
        tensor_output(
            "image_latents", "VAE latents of the image (None when the denoising does not need them)."
        ),
        tensor_output("mask_condition", "The preprocessed mask [N, 1, H, W] in {0, 1}."),
        tensor_output("masked_image", "The image with the masked area zeroed, or the given latents."),
        OutputParam("crops_coords", type_hint=tuple, description="The crop of padding_mask_crop, or None."),
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        bs = self.get_block_state(state)
        height, width = default_size(components, bs.height, bs.width)
        crops_coords, resize_mode = None, "default"
        if bs.padding_mask_crop is not None:
            crops_coords = components.mask_processor.get_crop_region(
                bs.mask_image, width, height, pad=bs.padding_mask_crop
            )
            resize_mode = "fill"
        image = image_processor_for_vae(components).preprocess(
            bs.image, height=height, width=width, crops_coords=crops_coords, resize_mode=resize_mode
        )
        image = image.to(dtype=torch.float32)
        vae = components.vae
        # The classic pipeline needs the image's latents to paste the kept area back (a transformer reading the
        # latents alone) or to start from the noised image (strength below 1).
        # Read from the transformer's config (it does not run here, so it stays out of this step's plan).
        transformer = getattr(components, "transformer", None)
        paste_back = transformer is None or transformer.config.in_channels == vae.config.latent_channels
        image_latents = None
        if paste_back or (bs.latents is None and bs.strength != 1.0):
            check_generators(self, bs.generator, bs.batch_size * bs.num_images_per_prompt)
            pixels = image.to(device=components._execution_device, dtype=bs.dtype)
            image_latents = _encode(vae, pixels, bs.generator)
        mask_condition = mask_processor_for_vae(components).preprocess(
            bs.mask_image, height=height, width=width, resize_mode=resize_mode, crops_coords=crops_coords
        )
        if bs.masked_image_latents is None:
            bs.masked_image = image * (mask_condition < 0.5)
        else:
            bs.masked_image = bs.masked_image_latents
        bs.image_latents, bs.mask_condition, bs.crops_coords = image_latents, mask_condition, crops_coords
        self.set_block_state(state, bs)
        return components, state
