"""Steps that prepare the latents to denoise: initial noise, noised image latents, mask latents.

Batch expansion is in inputs.py, timesteps in timesteps.py.
"""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators, repeat_images
from blocks.common.params import (
    BATCH_INPUTS,
    DTYPE,
    INITIAL_LATENTS_OUTPUT,
    LATENT_TIMESTEP,
    tensor_input,
    tensor_output,
)
from modular import ComponentSpec, InputParam, ModularPipelineBlocks

from .utils import (
    INPAINT_STRENGTH,
    MODEL_NAME,
    SCHEDULER,
    default_size,
    do_classifier_free_guidance,
    encode_vae_image,
    guidance_scale,
    guidance_scale_input,
    repeat_to_batch,
    strength_input,
    vae_scale_factor,
)

__all__ = [
    "StableDiffusionPrepareLatentsStep",
    "StableDiffusionImg2ImgPrepareLatentsStep",
    "StableDiffusionInpaintPrepareLatentsStep",
]


class StableDiffusionPrepareLatentsStep(ModularPipelineBlocks):
    """Draw the initial noise for text-to-image (or take the given latents), scaled by init_noise_sigma."""

    model_name = MODEL_NAME

    description = (
        "Draws initial latents [batch, unet.in_channels, height / s, width / s] (s: VAE scale) with the "
        "generator, or takes `latents`, and scales them by the scheduler's init_noise_sigma."
    )

    expected_components = [ComponentSpec("unet", "diffusers.UNet2DConditionModel"), SCHEDULER]

    inputs = [
        InputParam.template("height"),
        InputParam.template("width"),
        InputParam.template("latents"),
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [INITIAL_LATENTS_OUTPUT]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        scale = vae_scale_factor(components)
        total = block_state.batch_size * block_state.num_images_per_prompt
        check_generators(self, block_state.generator, total)
        device = components._execution_device
        if block_state.latents is None:
            shape = (total, components.unet.config.in_channels, int(height) // scale, int(width) // scale)
            latents = randn_tensor(
                shape, generator=block_state.generator, device=device, dtype=block_state.dtype
            )
        else:
            latents = block_state.latents.to(device)
        block_state.latents = latents * components.scheduler.init_noise_sigma
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


class StableDiffusionImg2ImgPrepareLatentsStep(ModularPipelineBlocks):
    """Noise the reference image's latents to the first kept timestep."""

    model_name = MODEL_NAME

    description = (
        "Repeats image_latents to the batch, draws noise with the generator and adds it at latent_timestep "
        "with the scheduler's add_noise."
    )

    expected_components = [SCHEDULER]

    inputs = [
        tensor_input("image_latents", "Latents of the image.", required=True),
        LATENT_TIMESTEP,
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [INITIAL_LATENTS_OUTPUT]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        total = block_state.batch_size * block_state.num_images_per_prompt
        check_generators(self, block_state.generator, total)
        image_latents = repeat_images(self, block_state.image_latents, total)
        noise = randn_tensor(
            image_latents.shape,
            generator=block_state.generator,
            device=components._execution_device,
            dtype=block_state.dtype,
        )
        block_state.latents = components.scheduler.add_noise(
            image_latents, noise, block_state.latent_timestep
        )
        self.set_block_state(state, block_state)
        return components, state


class StableDiffusionInpaintPrepareLatentsStep(ModularPipelineBlocks):
    """Initial latents and mask latents for inpainting, drawing from the generator in the classic order."""

    model_name = MODEL_NAME

    description = (
        "Draws the initial noise (pure noise at strength 1, else image_latents noised to latent_timestep), "
        "then downsamples the mask to the latent size and encodes the masked image with the VAE; both are "
        "repeated to the batch and doubled when guidance is on."
    )

    expected_components = [
        ComponentSpec("vae", "diffusers.AutoencoderKL"),
        ComponentSpec("unet", "diffusers.UNet2DConditionModel"),
        SCHEDULER,
    ]

    inputs = [
        tensor_input("image_latents", "Scaled VAE latents of the image."),
        tensor_input("mask_condition", "The binarized mask.", required=True),
        tensor_input("masked_image", "The masked image.", required=True),
        tensor_input("latent_timestep", "The first timestep."),
        strength_input(INPAINT_STRENGTH),
        InputParam.template("latents"),
        InputParam.template("height"),
        InputParam.template("width"),
        *BATCH_INPUTS,
        DTYPE,
        guidance_scale_input(),
    ]

    intermediate_outputs = [
        INITIAL_LATENTS_OUTPUT,
        tensor_output("noise", "The noise the latents started from."),
        tensor_output("image_latents", "Image latents repeated to the batch."),
        tensor_output("mask", "The mask at latent size, per model input."),
        tensor_output("masked_image_latents", "Latents of the masked image."),
    ]

    def _check_unet(self, components, mask: torch.Tensor, masked: torch.Tensor | None) -> None:
        """An inpainting UNet reads the latents alone (4 channels) or with the mask and masked image (9)."""
        in_channels = components.unet.config.in_channels
        if in_channels == 4:
            return
        latent_channels = components.vae.config.latent_channels
        masked_channels = 0 if masked is None else masked.shape[1]
        if in_channels != 9 or latent_channels + mask.shape[1] + masked_channels != in_channels:
            msg = (
                f"{type(self).__name__}: the UNet takes {in_channels} input channels; an inpainting UNet takes 4, "
                f"or 9 = latents ({latent_channels}) + mask ({mask.shape[1]}) + masked image latents "
                f"({masked_channels}); check the unet config and the inputs"
            )
            raise ValueError(msg)

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        device, dtype, generator = components._execution_device, block_state.dtype, block_state.generator
        height, width = default_size(components, block_state.height, block_state.width)
        scale = vae_scale_factor(components)
        total = block_state.batch_size * block_state.num_images_per_prompt
        check_generators(self, generator, total)
        strength = block_state.strength  # the declared default fills a missing one
        full_strength = strength == 1.0
        image_latents = block_state.image_latents
        if image_latents is not None:
            image_latents = image_latents.repeat(total // image_latents.shape[0], 1, 1, 1)
        elif block_state.latents is None and not full_strength:
            msg = f"{type(self).__name__}: strength {strength} < 1 starts from the image, but image_latents is missing"
            raise ValueError(msg)

        if block_state.latents is None:
            shape = (total, components.vae.config.latent_channels, int(height) // scale, int(width) // scale)
            noise = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
            if full_strength:
                latents = noise * components.scheduler.init_noise_sigma
            else:
                latents = components.scheduler.add_noise(image_latents, noise, block_state.latent_timestep)
        else:
            noise = block_state.latents.to(device)
            latents = noise * components.scheduler.init_noise_sigma

        # The masked image is encoded after the noise is drawn: the generator's draws keep the classic order.
        mask = torch.nn.functional.interpolate(
            block_state.mask_condition, size=(height // scale, width // scale)
        )
        mask = mask.to(device=device, dtype=dtype)
        masked_image = block_state.masked_image.to(device=device, dtype=dtype)
        if masked_image.shape[1] == 4:
            masked_image_latents = masked_image
        else:
            masked_image_latents = encode_vae_image(components.vae, masked_image, generator)
        mask = repeat_to_batch(mask, total, "mask_image")
        masked_image_latents = repeat_to_batch(masked_image_latents, total, "image")
        if do_classifier_free_guidance(components, guidance_scale(components, block_state.guidance_scale)):
            mask = torch.cat([mask] * 2)
            masked_image_latents = torch.cat([masked_image_latents] * 2)
        masked_image_latents = masked_image_latents.to(device=device, dtype=dtype)
        self._check_unet(components, mask, masked_image_latents)

        block_state.latents, block_state.noise, block_state.image_latents = latents, noise, image_latents
        block_state.mask, block_state.masked_image_latents = mask, masked_image_latents
        self.set_block_state(state, block_state)
        return components, state
