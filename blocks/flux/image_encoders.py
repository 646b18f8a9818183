"""VAE encoding of the reference image (image-to-image) and of the control image (control workflows)."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL

from blocks.common.vae import retrieve_latents
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .before_denoise import LATENTS
from .utils import (
    BATCH,
    DTYPE,
    IMAGE_PROCESSOR,
    MODEL_NAME,
    check_generators,
    default_size,
    encode_vae_image,
    image_processor_for_vae,
    pack_latents,
)

__all__ = ["FluxVaeEncoderStep", "FluxControlImageEncoderStep", "CONTROL_IMAGE"]

CONTROL_IMAGE = InputParam.template(
    "image",
    name="control_image",
    required=True,
    description="The control image (e.g. canny edges or a depth map) the control transformer follows.",
)


class FluxVaeEncoderStep(ModularPipelineBlocks):
    """Image-to-image: preprocess the reference image to height x width and encode it to Flux latents."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Preprocesses `image` to height x width (default 128 latent cells a side) in [-1, 1] and encodes it "
            "with the VAE into image_latents [N, C, h, w], (sample - shift_factor) * scaling_factor. A tensor "
            "with the VAE's latent channels is taken as latents already; with given `latents` nothing is encoded."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("vae", AutoencoderKL), IMAGE_PROCESSOR]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("image", required=True),
            InputParam.template("height"),
            InputParam.template("width"),
            LATENTS,
            InputParam.template("generator"),
            BATCH,
            InputParam.template("num_images_per_prompt"),
            DTYPE,
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam(
                "image_latents",
                type_hint=torch.Tensor,
                description="VAE latents of the image, not packed; None when latents are given.",
            ),
        ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        image = image_processor_for_vae(components).preprocess(block_state.image, height=height, width=width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        check_generators(self, block_state.generator, total)
        image_latents = None
        if block_state.latents is None:
            vae = components.vae
            dtype = block_state.dtype or vae.dtype
            image = image.to(dtype=torch.float32).to(device=components._execution_device, dtype=dtype)
            if image.shape[1] == vae.config.latent_channels:
                image_latents = image
            else:
                # One generator per given image (not per output image), as the classic pipeline draws them.
                image_latents = encode_vae_image(vae, image, block_state.generator)
        block_state.image_latents = image_latents
        self.set_block_state(state, block_state)
        return components, state


class FluxControlImageEncoderStep(ModularPipelineBlocks):
    """Control: preprocess the control image, repeat it to the batch, encode and pack it."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Preprocesses `control_image` to height x width (a tensor is taken as preprocessed), repeats it to "
            "the batch, encodes it with the VAE ((sample - shift_factor) * scaling_factor) and packs it into "
            "control_latents [B, tokens, C * 4], read beside the latents by a control transformer. A 3-dim "
            "tensor is taken as packed latents already. It runs before the initial noise is drawn, so the "
            "generator's draws keep the classic order."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("vae", AutoencoderKL), IMAGE_PROCESSOR]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            CONTROL_IMAGE,
            InputParam.template("height"),
            InputParam.template("width"),
            InputParam.template("generator"),
            BATCH,
            InputParam.template("num_images_per_prompt"),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam(
                "control_latents",
                type_hint=torch.Tensor,
                description="Packed VAE latents of the control image, [B, tokens, C * 4].",
            ),
        ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        count = block_state.num_images_per_prompt
        total = block_state.batch_size * count
        check_generators(self, block_state.generator, total)
        image = block_state.control_image
        if not isinstance(image, torch.Tensor):
            image = image_processor_for_vae(components).preprocess(image, height=height, width=width)
        # One control image serves every output image; one per prompt is repeated per image of that prompt.
        image = image.repeat_interleave(total if image.shape[0] == 1 else count, dim=0)
        vae = components.vae
        image = image.to(device=components._execution_device, dtype=vae.dtype)
        if image.ndim == 4:
            latents = retrieve_latents(vae.encode(image), generator=block_state.generator)
            image = pack_latents((latents - vae.config.shift_factor) * vae.config.scaling_factor)
        if image.shape[0] != total:
            msg = (
                f"{type(self).__name__}: {image.shape[0]} control images for a batch of {total} "
                "(prompts x num_images_per_prompt); pass 1 control image or one per prompt"
            )
            raise ValueError(msg)
        block_state.control_latents = image
        self.set_block_state(state, block_state)
        return components, state
