"""Edit's image steps: resize the input image to its working size, and encode it to packed latent tokens."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.params import BATCH_INPUTS, DTYPE, HEIGHT_WIDTH_OUTPUTS, tensor_output
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import IMAGE_PROCESSOR, MODEL_NAME, VAE, floor_to_multiple, image_processor_for_vae, pack_latents

__all__ = ["EDIT_AREA", "edit_image_size", "QwenImageEditResizeStep", "QwenImageEditVaeEncoderStep"]

EDIT_AREA = 1024 * 1024  # pixels: the classic edit pipeline works on the image resized to about this area


def edit_image_size(
    components: Any, image: Any, height: int | None, width: int | None
) -> tuple[int, int, int, int]:
    """The output size and the input image's working size: (height, width, image_height, image_width).

    The working size keeps the image's aspect ratio at about ``EDIT_AREA`` pixels, in multiples of 32
    (diffusers' ``calculate_dimensions``); the output size defaults to it, and is rounded down to a multiple
    of twice the VAE scale, as the classic pipeline does."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit

    image_width, image_height = image.size
    # Looked up on the module at each call, as the classic pipeline does.
    calculated_width, calculated_height, _ = pipeline_qwenimage_edit.calculate_dimensions(
        EDIT_AREA, image_width / image_height
    )
    height, width = floor_to_multiple(components, height or calculated_height, width or calculated_width)
    return height, width, calculated_height, calculated_width


class QwenImageEditResizeStep(ModularPipelineBlocks):
    """Resize the input image to its working size (about 1024 x 1024 at its aspect ratio) and preprocess it."""

    model_name = MODEL_NAME

    description = (
        "Resizes `image` to about 1024 x 1024 pixels at its aspect ratio (multiples of 32): prompt_image, which "
        "the text encoder sees, and processed_image, the same in [-1, 1] as [1, 3, 1, H, W] for the VAE. Height "
        "and width default to that size, rounded down to a multiple of twice the VAE scale."
    )

    expected_components = [IMAGE_PROCESSOR]

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("height"),
        InputParam.template("width"),
    ]

    intermediate_outputs = [
        OutputParam("prompt_image", type_hint=Any, description="The input image at its working size (PIL)."),
        tensor_output("processed_image", "The input image at its working size, [1, 3, 1, H, W] in [-1, 1]."),
        OutputParam("image_height", type_hint=int, description="The input image's working height."),
        OutputParam("image_width", type_hint=int, description="The input image's working width."),
        *HEIGHT_WIDTH_OUTPUTS,
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        bs.height, bs.width, bs.image_height, bs.image_width = edit_image_size(
            components, bs.image, bs.height, bs.width
        )
        processor = image_processor_for_vae(components)
        bs.prompt_image = processor.resize(bs.image, bs.image_height, bs.image_width)
        bs.processed_image = processor.preprocess(bs.prompt_image, bs.image_height, bs.image_width).unsqueeze(
            2
        )
        self.set_block_state(state, bs)
        return components, state


def _normalized(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    std = torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return (latents - mean) / std


class QwenImageEditVaeEncoderStep(ModularPipelineBlocks):
    """Encode the input image to the VAE's normalized latents (its mode), repeated to the batch and packed."""

    model_name = MODEL_NAME

    description = (
        "Encodes processed_image (in the prompt embeddings' dtype) with the VAE, takes the latent distribution's "
        "mode, normalizes it with latents_mean and latents_std, repeats it to the batch (prompts x "
        "num_images_per_prompt, the whole set of images per repeat) and packs it into [batch, tokens, C * 4]."
    )

    expected_components = [VAE]

    inputs = [
        InputParam("processed_image", type_hint=torch.Tensor, required=True, description="[1, 3, 1, H, W]."),
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [tensor_output("image_latents", "The input image's packed, normalized latents.")]

    @torch.no_grad()
    def __call__(self, components, state):
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import retrieve_latents

        block_state = self.get_block_state(state)
        bs = block_state
        vae = components.vae
        image = bs.processed_image.to(device=components._execution_device, dtype=bs.dtype)
        channels = vae.config.z_dim
        if image.shape[1] == channels:
            latents = image
        elif isinstance(bs.generator, list):
            latents = torch.cat(
                [
                    retrieve_latents(
                        vae.encode(image[i : i + 1]), generator=bs.generator[i], sample_mode="argmax"
                    )
                    for i in range(image.shape[0])
                ]
            )
            latents = _normalized(vae, latents)
        else:
            latents = retrieve_latents(vae.encode(image), generator=bs.generator, sample_mode="argmax")
            latents = _normalized(vae, latents)
        total, count = bs.batch_size * bs.num_images_per_prompt, latents.shape[0]
        if total % count != 0:
            msg = (
                f"{type(self).__name__}: {count} images cannot be repeated to a batch of {total} (prompts x "
                "num_images_per_prompt); pass 1 image"
            )
            raise ValueError(msg)
        # The whole set of images per repeat ([i0, i1, i0, i1]), as the classic pipeline repeats them.
        latents = torch.cat([latents] * (total // count)) if total > count else latents
        bs.image_latents = pack_latents(latents, channels)
        self.set_block_state(state, bs)
        return components, state
