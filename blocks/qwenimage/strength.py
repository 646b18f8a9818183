"""Image-to-image and inpainting before the loop: the timesteps cut by strength, and the reference image's
latents noised to the first kept timestep (flow matching's scale_noise), packed."""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators, repeat_images
from blocks.common.params import BATCH_INPUTS, BATCH_SIZE, DTYPE, LATENT_TIMESTEP, tensor_input, tensor_output
from blocks.common.timesteps import StrengthTimestepsStep, flow_kept_steps, scheduler_mu
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .before_denoise import IMG_SHAPES, LATENTS, SIGMAS
from .utils import (
    MODEL_NAME,
    SCHEDULER,
    TRANSFORMER,
    default_sigmas,
    latent_size,
    pack_latents,
    qwen_vae_scale_factor,
)

__all__ = [
    "STRENGTH",
    "STRENGTH_INPUT",
    "QwenImageImg2ImgSetTimestepsStep",
    "QwenImageImg2ImgPrepareLatentsStep",
    "QwenImageInpaintPrepareLatentsStep",
]

STRENGTH = 0.6  # the classic image-to-image and inpainting pipelines' default
STRENGTH_INPUT = InputParam.template("strength", default=STRENGTH)


class QwenImageImg2ImgSetTimestepsStep(StrengthTimestepsStep):
    """Set the timesteps as for text-to-image (shifted by the image's token count) and keep the last
    ``strength`` part of them."""

    model_name = MODEL_NAME
    default_strength = STRENGTH

    description = (
        "Sets the scheduler's timesteps from sigmas 1 .. 1/num_inference_steps (or custom sigmas), shifted by "
        "the image's token count, then skips the first (1 - strength) of them (strength 0.6 by default): "
        "denoising starts from the image latents noised to the first kept timestep (latent_timestep)."
    )

    expected_components = [SCHEDULER]

    inputs = [
        InputParam.template("num_inference_steps"),
        SIGMAS,
        InputParam("height", type_hint=int, required=True, description="The image height in pixels."),
        InputParam("width", type_hint=int, required=True, description="The image width in pixels."),
        STRENGTH_INPUT,
        BATCH_SIZE,
        InputParam.template("num_images_per_prompt"),
    ]

    def set_timesteps(self, components, block_state) -> int:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import retrieve_timesteps

        bs = block_state
        scale = qwen_vae_scale_factor(components)
        tokens = (int(bs.height) // scale // 2) * (int(bs.width) // scale // 2)
        steps = bs.num_inference_steps
        sigmas = default_sigmas(steps) if bs.sigmas is None else bs.sigmas
        scheduler = components.scheduler
        _, steps = retrieve_timesteps(
            scheduler, steps, components._execution_device, sigmas=sigmas, mu=scheduler_mu(scheduler, tokens)
        )
        return steps

    def kept_steps(self, steps: int, strength: float) -> int:
        return flow_kept_steps(steps, strength)


class QwenImageImg2ImgPrepareLatentsStep(ModularPipelineBlocks):
    """Noise the reference image's latents to the first kept timestep and pack them; or take given latents."""

    model_name = MODEL_NAME

    description = (
        "Repeats image_latents to the batch, draws noise [batch, 1, C, h, w] with the generator and mixes it in "
        "at latent_timestep with the scheduler's scale_noise, packed into [batch, tokens, C * 4]. Given `latents` "
        "(packed) are used as they are."
    )

    expected_components = [TRANSFORMER, SCHEDULER]

    inputs = [
        tensor_input("image_latents", "The image's normalized VAE latents [images, C, 1, h, w]."),
        LATENT_TIMESTEP,
        InputParam("height", type_hint=int, required=True, description="The image height in pixels."),
        InputParam("width", type_hint=int, required=True, description="The image width in pixels."),
        LATENTS,
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [OutputParam.template("latents", note="initial, packed"), IMG_SHAPES]

    def noised(self, components, bs, total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(noise, image latents, their noised mix), each [total, 1, C, h, w]."""
        check_generators(self, bs.generator, total)
        device = components._execution_device
        image_latents = repeat_images(self, bs.image_latents, total).transpose(1, 2)
        channels = components.transformer.config.in_channels // 4
        shape = (total, 1, channels, *latent_size(components, bs.height, bs.width))
        noise = randn_tensor(shape, generator=bs.generator, device=device, dtype=bs.dtype)
        return (
            noise,
            image_latents,
            components.scheduler.scale_noise(image_latents, bs.latent_timestep, noise),
        )

    def image_shapes(self, components, bs) -> list:
        scale = qwen_vae_scale_factor(components)
        return [[(1, bs.height // scale // 2, bs.width // scale // 2)]] * bs.batch_size

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        total = bs.batch_size * bs.num_images_per_prompt
        if bs.latents is not None:
            bs.latents = bs.latents.to(device=components._execution_device, dtype=bs.dtype)
        else:
            _, _, latents = self.noised(components, bs, total)
            bs.latents = pack_latents(latents, latents.shape[2])
        bs.img_shapes = self.image_shapes(components, bs)
        self.set_block_state(state, bs)
        return components, state


class QwenImageInpaintPrepareLatentsStep(QwenImageImg2ImgPrepareLatentsStep):
    """Inpainting: the noised image latents as for image-to-image, and the noise and clean image latents
    (packed) that the loop blends back outside the mask at every step."""

    description = (
        "Noises the image latents to latent_timestep as image-to-image does (given `latents`, packed, are used as "
        "they are and stand in for the noise), packed; also image_latents and noise, packed, for the loop's blend."
    )

    intermediate_outputs = [
        OutputParam.template("latents", note="initial, packed"),
        IMG_SHAPES,
        tensor_output(
            "image_latents", "The image's packed, normalized latents (the loop keeps them outside the mask)."
        ),
        tensor_output("noise", "The packed noise the image latents are noised with at each step."),
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        total = bs.batch_size * bs.num_images_per_prompt
        channels = components.transformer.config.in_channels // 4
        if bs.latents is None:
            noise, image_latents, latents = self.noised(components, bs, total)
            bs.latents = pack_latents(latents, channels)
        else:
            image_latents = repeat_images(self, bs.image_latents, total).transpose(1, 2)
            noise = bs.latents = bs.latents.to(device=components._execution_device, dtype=bs.dtype)
        bs.noise = noise if noise.dim() == 3 else pack_latents(noise, channels)
        bs.image_latents = pack_latents(image_latents, channels)
        bs.img_shapes = self.image_shapes(components, bs)
        self.set_block_state(state, bs)
        return components, state
