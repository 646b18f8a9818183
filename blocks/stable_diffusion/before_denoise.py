"""Steps that prepare the latents to denoise: initial noise, noised image latents, mask latents.

Batch expansion is in inputs.py, timesteps in timesteps.py.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.utils.torch_utils import randn_tensor

from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    MODEL_NAME,
    SCHEDULER,
    default_size,
    do_classifier_free_guidance,
    encode_vae_image,
    repeat_to_batch,
    strength_input,
    vae_scale_factor,
)

__all__ = [
    "StableDiffusionPrepareLatentsStep",
    "StableDiffusionImg2ImgPrepareLatentsStep",
    "StableDiffusionInpaintPrepareLatentsStep",
]

_BATCH = InputParam("batch_size", type_hint=int, required=True, description="Number of prompts.")
_DTYPE = InputParam("dtype", type_hint=torch.dtype, description="The dtype of the model inputs.")


def _check_generators(block: ModularPipelineBlocks, generator, total: int) -> None:
    if isinstance(generator, list) and len(generator) != total:
        msg = (
            f"{type(block).__name__}: a list of generators needs one per image (got {len(generator)} for a batch "
            f"of {total} = prompts x num_images_per_prompt); pass one generator or {total}"
        )
        raise ValueError(msg)


class StableDiffusionPrepareLatentsStep(ModularPipelineBlocks):
    """Draw the initial noise for text-to-image (or take the given latents), scaled by init_noise_sigma."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Draws initial latents [batch, unet.in_channels, height / s, width / s] (s: VAE scale) with the "
            "generator, or takes `latents`, and scales them by the scheduler's init_noise_sigma."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("unet", UNet2DConditionModel), SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("height"),
            InputParam.template("width"),
            InputParam.template("latents"),
            InputParam.template("generator"),
            _BATCH,
            InputParam.template("num_images_per_prompt"),
            _DTYPE,
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam("latents", type_hint=torch.Tensor, description="The initial latents to denoise.")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        scale = vae_scale_factor(components)
        total = block_state.batch_size * block_state.num_images_per_prompt
        _check_generators(self, block_state.generator, total)
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

    @property
    def description(self) -> str:
        return (
            "Repeats image_latents to the batch, draws noise with the generator and adds it at latent_timestep "
            "with the scheduler's add_noise."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam(
                "image_latents", type_hint=torch.Tensor, required=True, description="Latents of the image."
            ),
            InputParam(
                "latent_timestep", type_hint=torch.Tensor, required=True, description="The first timestep."
            ),
            InputParam.template("generator"),
            _BATCH,
            InputParam.template("num_images_per_prompt"),
            _DTYPE,
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam("latents", type_hint=torch.Tensor, description="The initial latents to denoise.")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        total = block_state.batch_size * block_state.num_images_per_prompt
        _check_generators(self, block_state.generator, total)
        image_latents = block_state.image_latents
        if total > image_latents.shape[0]:
            if total % image_latents.shape[0] != 0:
                msg = (
                    f"{type(self).__name__}: {image_latents.shape[0]} images cannot be repeated to a batch of "
                    f"{total} (prompts x num_images_per_prompt); pass 1 image or {total}"
                )
                raise ValueError(msg)
            # torch.cat, not Tensor.repeat: cat keeps the VAE output's memory layout (channels-last on CPU),
            # and the UNet's convolutions round differently per layout; the classic pipeline uses cat.
            image_latents = torch.cat([image_latents] * (total // image_latents.shape[0]))
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

    @property
    def description(self) -> str:
        return (
            "Draws the initial noise (pure noise at strength 1, else image_latents noised to latent_timestep), "
            "then downsamples the mask to the latent size and encodes the masked image with the VAE; both are "
            "repeated to the batch and doubled when guidance is on."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("vae", AutoencoderKL), ComponentSpec("unet", UNet2DConditionModel), SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam(
                "image_latents", type_hint=torch.Tensor, description="Scaled VAE latents of the image."
            ),
            InputParam(
                "mask_condition", type_hint=torch.Tensor, required=True, description="The binarized mask."
            ),
            InputParam(
                "masked_image", type_hint=torch.Tensor, required=True, description="The masked image."
            ),
            InputParam("latent_timestep", type_hint=torch.Tensor, description="The first timestep."),
            strength_input(),
            InputParam.template("latents"),
            InputParam.template("height"),
            InputParam.template("width"),
            InputParam.template("generator"),
            _BATCH,
            InputParam.template("num_images_per_prompt"),
            _DTYPE,
            InputParam.template("guidance_scale"),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam("latents", type_hint=torch.Tensor, description="The initial latents to denoise."),
            OutputParam("noise", type_hint=torch.Tensor, description="The noise the latents started from."),
            OutputParam(
                "image_latents", type_hint=torch.Tensor, description="Image latents repeated to the batch."
            ),
            OutputParam(
                "mask", type_hint=torch.Tensor, description="The mask at latent size, per model input."
            ),
            OutputParam(
                "masked_image_latents", type_hint=torch.Tensor, description="Latents of the masked image."
            ),
        ]

    def _check_unet(self, components, mask, masked_image_latents) -> None:
        in_channels = components.unet.config.in_channels
        latent_channels = components.vae.config.latent_channels
        if in_channels == 9:
            total = latent_channels + mask.shape[1] + masked_image_latents.shape[1]
            if total != in_channels:
                msg = (
                    f"{type(self).__name__}: the UNet takes {in_channels} input channels, but latents "
                    f"({latent_channels}) + mask ({mask.shape[1]}) + masked image latents "
                    f"({masked_image_latents.shape[1]}) make {total}; check the unet config and the inputs"
                )
                raise ValueError(msg)
        elif in_channels != 4:
            msg = f"{type(self).__name__}: an inpainting UNet takes 4 or 9 input channels (got {in_channels})"
            raise ValueError(msg)

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        device, dtype, generator = components._execution_device, block_state.dtype, block_state.generator
        height, width = default_size(components, block_state.height, block_state.width)
        scale = vae_scale_factor(components)
        total = block_state.batch_size * block_state.num_images_per_prompt
        _check_generators(self, generator, total)
        strength = 1.0 if block_state.strength is None else block_state.strength
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
        if do_classifier_free_guidance(components, block_state.guidance_scale):
            mask = torch.cat([mask] * 2)
            masked_image_latents = torch.cat([masked_image_latents] * 2)
        masked_image_latents = masked_image_latents.to(device=device, dtype=dtype)
        self._check_unet(components, mask, masked_image_latents)

        block_state.latents, block_state.noise, block_state.image_latents = latents, noise, image_latents
        block_state.mask, block_state.masked_image_latents = mask, masked_image_latents
        self.set_block_state(state, block_state)
        return components, state
