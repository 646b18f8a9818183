"""Steps that prepare the latents to denoise: initial noise, the image noised by flow matching, and the
inpainting mask and masked-image latents."""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators, repeat_images
from blocks.common.params import (
    BATCH_INPUTS,
    DTYPE,
    HEIGHT_WIDTH_OUTPUTS,
    LATENT_TIMESTEP,
    tensor_input,
    tensor_output,
)
from blocks.common.vae import retrieve_latents, shift_and_scale, vae_scale_factor
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, SCHEDULER, TRANSFORMER, default_size

__all__ = [
    "SD3PrepareLatentsStep",
    "SD3Img2ImgPrepareLatentsStep",
    "SD3InpaintPrepareLatentsStep",
    "SD3InpaintPrepareMaskLatentsStep",
]

_VAE = ComponentSpec("vae", "diffusers.AutoencoderKL")
_LATENTS_OUTPUT = OutputParam(
    "latents", type_hint=torch.Tensor, description="The initial latents [B, C, h, w]."
)


def _latent_inputs() -> list[InputParam]:
    return [
        InputParam.template("height"),
        InputParam.template("width"),
        InputParam.template("latents"),
        *BATCH_INPUTS,
        DTYPE,
    ]


def _latent_shape(
    components, total: int, channels: int, height: int, width: int
) -> tuple[int, int, int, int]:
    scale = vae_scale_factor(components)
    return (total, channels, int(height) // scale, int(width) // scale)


class SD3PrepareLatentsStep(ModularPipelineBlocks):
    """Draw the initial noise for text-to-image, or take the given latents."""

    model_name = MODEL_NAME

    description = (
        "Draws initial latents [B, transformer.in_channels, height / s, width / s] (s: the VAE scale; height and "
        "width default to the transformer's sample size in pixels) with the generator in the embeddings' "
        "dtype, or takes `latents`."
    )

    expected_components = [TRANSFORMER]

    inputs = _latent_inputs()

    intermediate_outputs = [_LATENTS_OUTPUT, *HEIGHT_WIDTH_OUTPUTS]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        device, dtype = components._execution_device, block_state.dtype
        if block_state.latents is None:
            check_generators(self, block_state.generator, total)
            channels = components.transformer.config.in_channels
            shape = _latent_shape(components, total, channels, height, width)
            block_state.latents = randn_tensor(
                shape, generator=block_state.generator, device=device, dtype=dtype
            )
        else:
            block_state.latents = block_state.latents.to(device=device, dtype=dtype)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


class SD3Img2ImgPrepareLatentsStep(ModularPipelineBlocks):
    """Noise the reference image's latents to the first kept timestep (flow matching's scale_noise)."""

    model_name = MODEL_NAME

    description = (
        "Repeats image_latents to the batch, draws noise of their shape with the generator and mixes it in at "
        "latent_timestep with the scheduler's scale_noise. Given `latents` are used as they are."
    )

    expected_components = [SCHEDULER]

    inputs = [*_latent_inputs(), tensor_input("image_latents", "VAE latents of the image."), LATENT_TIMESTEP]

    intermediate_outputs = [_LATENTS_OUTPUT, *HEIGHT_WIDTH_OUTPUTS]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        device, dtype = components._execution_device, block_state.dtype
        if block_state.latents is not None:
            block_state.latents = block_state.latents.to(device=device, dtype=dtype)
        else:
            if block_state.image_latents is None:
                msg = f"{type(self).__name__}: image_latents are missing; run the VAE encoder step or pass latents"
                raise ValueError(msg)
            image_latents = repeat_images(self, block_state.image_latents, total)
            # torch.cat even for a full batch, as the classic pipeline: a copy in the VAE output's memory layout.
            image_latents = torch.cat([image_latents], dim=0)
            noise = randn_tensor(
                image_latents.shape, generator=block_state.generator, device=device, dtype=dtype
            )
            noised = components.scheduler.scale_noise(image_latents, block_state.latent_timestep, noise)
            block_state.latents = noised.to(device=device, dtype=dtype)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


def _repeat(
    block: object, tensor: torch.Tensor, total: int, what: str, *, always: bool = False
) -> torch.Tensor:
    """`tensor` repeated along dim 0 up to `total` with Tensor.repeat, as the classic inpainting pipeline does
    (`always`: a copy even when full, as it copies the image latents; the copy is contiguous, and the
    transformer's patch convolution rounds differently per memory layout)."""
    count = tensor.shape[0]
    if total % count != 0:
        msg = (
            f"{type(block).__name__}: {count} {what} cannot be repeated to a batch of {total} "
            f"(prompts x num_images_per_prompt); pass 1 or {total}"
        )
        raise ValueError(msg)
    return tensor.repeat(total // count, 1, 1, 1) if always or count != total else tensor


class SD3InpaintPrepareLatentsStep(ModularPipelineBlocks):
    """Inpainting's initial latents: pure noise at strength 1, else the image latents noised to latent_timestep."""

    model_name = MODEL_NAME

    description = (
        "Draws noise [B, vae.latent_channels, h, w] with the generator; at strength 1 it is the initial latents, "
        "otherwise image_latents (repeated to the batch) are noised to latent_timestep with scale_noise. Given "
        "`latents` are both the initial latents and the noise. `noise` is kept for pasting back the unmasked "
        "area, image_latents are repeated to the batch for it."
    )

    expected_components = [SCHEDULER, _VAE]

    inputs = [
        *_latent_inputs(),
        tensor_input("image_latents", "VAE latents of the image (None when not needed)."),
        LATENT_TIMESTEP,
        InputParam.template("strength", default=0.6),
    ]

    intermediate_outputs = [
        _LATENTS_OUTPUT,
        tensor_output("noise", "The noise the latents started from."),
        tensor_output("image_latents", "VAE latents of the image, repeated to the batch (or None)."),
        *HEIGHT_WIDTH_OUTPUTS,
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        device, dtype = components._execution_device, block_state.dtype
        check_generators(self, block_state.generator, total)
        image_latents = block_state.image_latents
        if image_latents is not None:
            image_latents = _repeat(self, image_latents, total, "images", always=True)
        if block_state.latents is None:
            channels = components.vae.config.latent_channels
            shape = _latent_shape(components, total, channels, height, width)
            noise = randn_tensor(shape, generator=block_state.generator, device=device, dtype=dtype)
            if block_state.strength == 1.0:
                latents = noise
            else:
                latents = components.scheduler.scale_noise(image_latents, block_state.latent_timestep, noise)
        else:
            latents = noise = block_state.latents.to(device)
        block_state.latents, block_state.noise, block_state.image_latents = latents, noise, image_latents
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


class SD3InpaintPrepareMaskLatentsStep(ModularPipelineBlocks):
    """The mask at latent size and the masked image's latents, both repeated to the batch."""

    model_name = MODEL_NAME

    description = (
        "Resizes mask_condition to the latent size (nearest), encodes masked_image with the VAE (taken as "
        "latents when it has the VAE's latent channels), shifts and scales it as the classic pipeline does "
        "(given masked_image_latents too), and repeats both to the batch. Runs after the noise is drawn, so the "
        "generator's draws keep the classic order."
    )

    expected_components = [_VAE]

    inputs = [
        tensor_input("mask_condition", "The preprocessed mask [N, 1, H, W] in {0, 1}.", required=True),
        tensor_input(
            "masked_image", "The image with the masked area zeroed, or given latents.", required=True
        ),
        InputParam.template("height"),
        InputParam.template("width"),
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [
        tensor_output("mask", "The mask at latent size [B, 1, h, w]."),
        tensor_output("masked_image_latents", "Latents of the masked image [B, C, h, w]."),
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        device, dtype, vae = components._execution_device, block_state.dtype, components.vae
        scale = vae_scale_factor(components)
        mask = torch.nn.functional.interpolate(
            block_state.mask_condition, size=(height // scale, width // scale)
        )
        mask = mask.to(device=device, dtype=dtype)
        masked = block_state.masked_image.to(device=device, dtype=dtype)
        if masked.shape[1] != vae.config.latent_channels:
            masked = retrieve_latents(vae.encode(masked), generator=block_state.generator)
        masked = shift_and_scale(vae, masked)
        block_state.mask = _repeat(self, mask, total, "masks")
        block_state.masked_image_latents = _repeat(self, masked, total, "masked images").to(
            device=device, dtype=dtype
        )
        self.set_block_state(state, block_state)
        return components, state
