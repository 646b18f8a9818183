"""Steps that prepare what the loop reads: packed initial latents, their position ids, the guidance value."""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators, repeat_images
from blocks.common.params import BATCH_INPUTS, DTYPE, HEIGHT_WIDTH_OUTPUTS, LATENT_TIMESTEP, tensor_input
from blocks.common.vae import patched_latent_size
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    LATENTS,
    MODEL_NAME,
    SCHEDULER,
    default_size,
    latent_image_ids,
    pack_latents,
    transformer_channels_problem,
)

__all__ = [
    "FluxPrepareLatentsStep",
    "FluxControlPrepareLatentsStep",
    "FluxImg2ImgPrepareLatentsStep",
    "FluxGuidanceStep",
    "FluxImg2ImgGuidanceStep",
]

_TRANSFORMER = ComponentSpec("transformer", "diffusers.FluxTransformer2DModel")
_LATENT_OUTPUTS = [
    OutputParam(
        "latents", type_hint=torch.Tensor, description="The packed initial latents [B, tokens, C * 4]."
    ),
    OutputParam(
        "latent_image_ids",
        type_hint=torch.Tensor,
        kwargs_type="denoiser_input_fields",
        description="Position ids of the latent tokens, [tokens, 3].",
    ),
    *HEIGHT_WIDTH_OUTPUTS,
]


def _latent_inputs() -> list[InputParam]:
    return [
        InputParam.template("height"),
        InputParam.template("width"),
        LATENTS,
        *BATCH_INPUTS,
        DTYPE,
    ]


class FluxPrepareLatentsStep(ModularPipelineBlocks):
    """Draw the initial noise for text-to-image (or take the given latents), pack it, make the image ids."""

    model_name = MODEL_NAME
    # The transformer reads the packed latents alone (a control transformer also reads the control latents).
    inputs_per_latent = 1

    description = (
        "Draws initial noise [B, C, h, w] (C = transformer.out_channels / 4, h and w the latent size) with the "
        "generator and packs its 2x2 patches into latents [B, h/2 * w/2, C * 4], or takes packed `latents`; "
        "makes latent_image_ids, the (0, row, column) position of each token."
    )

    expected_components = [_TRANSFORMER]

    inputs = _latent_inputs()

    intermediate_outputs = list(_LATENT_OUTPUTS)

    def _channels(self, components) -> int:
        config = components.transformer.config
        problem = transformer_channels_problem(config, self.inputs_per_latent)
        if problem:
            msg = f"{type(self).__name__}: {problem}"
            raise ValueError(msg)
        return (config.out_channels or config.in_channels) // 4

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        channels = self._channels(components)
        height, width = default_size(components, block_state.height, block_state.width)
        latent_height, latent_width = patched_latent_size(components, height, width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        device, dtype = components._execution_device, block_state.dtype
        if block_state.latents is None:
            check_generators(self, block_state.generator, total)
            shape = (total, channels, latent_height, latent_width)
            noise = randn_tensor(shape, generator=block_state.generator, device=device, dtype=dtype)
            block_state.latents = pack_latents(noise)
        else:
            block_state.latents = block_state.latents.to(device=device, dtype=dtype)
        block_state.latent_image_ids = latent_image_ids(latent_height // 2, latent_width // 2, device, dtype)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


class FluxControlPrepareLatentsStep(FluxPrepareLatentsStep):
    """The initial noise for control: as text-to-image, for a transformer that also reads the control latents."""

    inputs_per_latent = 2


class FluxImg2ImgPrepareLatentsStep(ModularPipelineBlocks):
    """Noise the reference image's latents to the first kept timestep, pack them, make the image ids."""

    model_name = MODEL_NAME

    description = (
        "Repeats image_latents to the batch, draws noise with the generator, mixes them at latent_timestep "
        "with the scheduler's scale_noise and packs the result; given packed `latents` are used as they are."
    )

    expected_components = [SCHEDULER]

    inputs = [
        *_latent_inputs(),
        tensor_input("image_latents", "VAE latents of the image."),
        LATENT_TIMESTEP,
    ]

    intermediate_outputs = list(_LATENT_OUTPUTS)

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        latent_height, latent_width = patched_latent_size(components, height, width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        device, dtype = components._execution_device, block_state.dtype
        if block_state.latents is not None:
            block_state.latents = block_state.latents.to(device=device, dtype=dtype)
        else:
            check_generators(self, block_state.generator, total)
            image_latents = block_state.image_latents
            if image_latents is None:
                msg = f"{type(self).__name__}: image_latents are missing; run the VAE encoder step or pass latents"
                raise ValueError(msg)
            image_latents = repeat_images(self, image_latents, total)
            shape = (total, image_latents.shape[1], latent_height, latent_width)
            noise = randn_tensor(shape, generator=block_state.generator, device=device, dtype=dtype)
            noised = components.scheduler.scale_noise(image_latents, block_state.latent_timestep, noise)
            block_state.latents = pack_latents(noised)
        block_state.latent_image_ids = latent_image_ids(latent_height // 2, latent_width // 2, device, dtype)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


class FluxGuidanceStep(ModularPipelineBlocks):
    """The embedded guidance value per image, for a transformer with guidance_embeds (FLUX.1-dev)."""

    model_name = MODEL_NAME
    default_guidance_scale = 3.5

    description = (
        "Makes guidance, guidance_scale repeated per image (float32), for a guidance-distilled transformer "
        "(config.guidance_embeds); None for one without (FLUX.1-schnell). guidance_scale defaults to 3.5, "
        "7.0 for image-to-image, as in the classic pipelines."
    )

    expected_components = [_TRANSFORMER]

    inputs = [
        InputParam.template(
            "guidance_scale",
            default=None,
            description="Embedded guidance scale (default 3.5; 7.0 for image-to-image).",
        ),
        tensor_input("latents", "The packed latents.", required=True),
    ]

    intermediate_outputs = [
        OutputParam(
            "guidance",
            type_hint=torch.Tensor,
            kwargs_type="denoiser_input_fields",
            description="The guidance value per image [B], or None.",
        )
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        guidance = None
        if components.transformer.config.guidance_embeds:
            scale = block_state.guidance_scale
            scale = self.default_guidance_scale if scale is None else scale
            guidance = torch.full([1], scale, device=components._execution_device, dtype=torch.float32)
            guidance = guidance.expand(block_state.latents.shape[0])
        block_state.guidance = guidance
        self.set_block_state(state, block_state)
        return components, state


class FluxImg2ImgGuidanceStep(FluxGuidanceStep):
    """The embedded guidance with image-to-image's default scale of 7.0."""

    default_guidance_scale = 7.0
