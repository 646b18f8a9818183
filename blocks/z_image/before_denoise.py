"""Steps that prepare the latents to denoise: initial noise, or image latents noised by flow matching."""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators, repeat_images
from blocks.common.params import BATCH_INPUTS, DTYPE, INITIAL_LATENTS_OUTPUT, LATENT_TIMESTEP, tensor_input
from blocks.common.vae import patched_latent_size
from modular import ComponentSpec, InputParam, ModularPipelineBlocks

from .utils import MODEL_NAME, SCHEDULER, resolve_size

__all__ = ["ZImagePrepareLatentsStep", "ZImageImg2ImgPrepareLatentsStep"]

_TRANSFORMER = ComponentSpec("transformer", "diffusers.ZImageTransformer2DModel")


def _latent_shape(components, total: int, height: int, width: int) -> tuple[int, int, int, int]:
    latent_height, latent_width = patched_latent_size(components, height, width)
    return (total, components.transformer.config.in_channels, latent_height, latent_width)


class ZImagePrepareLatentsStep(ModularPipelineBlocks):
    """Draw the initial float32 noise for text-to-image, or take the given latents."""

    model_name = MODEL_NAME

    description = (
        "Draws initial float32 latents [batch, transformer.in_channels, height / s, width / s] "
        "(s: the VAE scale) with the generator, or checks and takes `latents`."
    )

    expected_components = [_TRANSFORMER]

    inputs = [
        InputParam.template("height"),
        InputParam.template("width"),
        InputParam.template("latents"),
        *BATCH_INPUTS,
    ]

    intermediate_outputs = [INITIAL_LATENTS_OUTPUT]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = resolve_size(self, components, block_state.height, block_state.width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        shape = _latent_shape(components, total, height, width)
        device = components._execution_device
        if block_state.latents is None:
            check_generators(self, block_state.generator, total)
            # The classic pipeline denoises in float32 whatever the models' dtype.
            latents = randn_tensor(shape, generator=block_state.generator, device=device, dtype=torch.float32)
        else:
            if tuple(block_state.latents.shape) != shape:
                msg = (
                    f"{type(self).__name__}: latents must have shape {shape} for {total} images of "
                    f"{height}x{width} (got {tuple(block_state.latents.shape)})"
                )
                raise ValueError(msg)
            latents = block_state.latents.to(device)
        block_state.latents = latents
        self.set_block_state(state, block_state)
        return components, state


class ZImageImg2ImgPrepareLatentsStep(ModularPipelineBlocks):
    """Noise the reference image's latents to the first kept timestep (flow matching's scale_noise)."""

    model_name = MODEL_NAME

    description = (
        "Repeats image_latents to the batch, draws noise with the generator and mixes it in at "
        "latent_timestep with the scheduler's scale_noise. Given `latents` are used as they are."
    )

    expected_components = [_TRANSFORMER, SCHEDULER]

    inputs = [
        tensor_input("image_latents", "Normalized VAE latents of the image."),
        LATENT_TIMESTEP,
        InputParam.template("height"),
        InputParam.template("width"),
        InputParam.template("latents"),
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [INITIAL_LATENTS_OUTPUT]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        device = components._execution_device
        dtype = block_state.dtype or torch.float32
        if block_state.latents is not None:
            block_state.latents = block_state.latents.to(device=device, dtype=dtype)
            self.set_block_state(state, block_state)
            return components, state
        if block_state.image_latents is None:
            msg = f"{type(self).__name__}: image-to-image needs image_latents (or latents); pass image=..."
            raise ValueError(msg)
        height, width = resolve_size(self, components, block_state.height, block_state.width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        check_generators(self, block_state.generator, total)
        image_latents = repeat_images(self, block_state.image_latents, total)
        shape = _latent_shape(components, total, height, width)
        if tuple(image_latents.shape) != shape:
            msg = (
                f"{type(self).__name__}: the image latents have shape {tuple(image_latents.shape)}, but a "
                f"{height}x{width} image needs {shape}; leave height and width unset to use the image's size"
            )
            raise ValueError(msg)
        noise = randn_tensor(shape, generator=block_state.generator, device=device, dtype=dtype)
        block_state.latents = components.scheduler.scale_noise(
            image_latents, block_state.latent_timestep, noise
        )
        self.set_block_state(state, block_state)
        return components, state
