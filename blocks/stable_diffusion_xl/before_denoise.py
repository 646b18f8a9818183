"""Steps that prepare the denoising: initial latents (noise, noised image, mask latents for inpainting),
and SDXL's micro-conditioning (add_time_ids)."""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators, repeat_images
from blocks.common.params import (
    BATCH_INPUTS,
    BATCH_SIZE,
    DTYPE,
    INITIAL_LATENTS_OUTPUT,
    LATENT_TIMESTEP,
    tensor_input,
)
from blocks.stable_diffusion.before_denoise import (
    StableDiffusionInpaintPrepareLatentsStep,
    StableDiffusionPrepareLatentsStep,
)
from blocks.stable_diffusion.utils import (
    SCHEDULER,
    default_size,
    do_classifier_free_guidance,
    repeat_to_batch,
    strength_input,
    vae_scale_factor,
)
from modular import ComponentSpec, ConfigSpec, InputParam, ModularPipelineBlocks, OutputParam

from .timesteps import DENOISING_START
from .utils import INPAINT_STRENGTH, MODEL_NAME, encode_image_latents, guidance_scale, guidance_scale_input

__all__ = [
    "StableDiffusionXLPrepareLatentsStep",
    "StableDiffusionXLImg2ImgPrepareLatentsStep",
    "StableDiffusionXLInpaintPrepareLatentsStep",
    "StableDiffusionXLPrepareAdditionalConditioningStep",
    "StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep",
]

_SIZE = tuple[int, int]


class StableDiffusionXLPrepareLatentsStep(StableDiffusionPrepareLatentsStep):
    """Text-to-image initial noise: the same as Stable Diffusion's."""

    model_name = MODEL_NAME


class StableDiffusionXLImg2ImgPrepareLatentsStep(ModularPipelineBlocks):
    """Noise the reference image's latents to the first kept timestep (or take the given latents)."""

    model_name = MODEL_NAME

    description = (
        "Repeats image_latents to the batch and adds noise drawn with the generator at latent_timestep "
        "(not with denoising_start: the image is then taken as partly denoised already). Given `latents` "
        "are used as they are."
    )

    expected_components = [SCHEDULER]

    inputs = [
        tensor_input("image_latents", "Latents of the image."),
        LATENT_TIMESTEP,
        InputParam.template("latents"),
        DENOISING_START,
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [INITIAL_LATENTS_OUTPUT]

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        if bs.latents is not None:
            self.set_block_state(state, bs)
            return components, state
        total = bs.batch_size * bs.num_images_per_prompt
        latents = repeat_images(self, bs.image_latents, total)
        if bs.denoising_start is None:
            check_generators(self, bs.generator, total)
            noise = randn_tensor(
                latents.shape, generator=bs.generator, device=components._execution_device, dtype=bs.dtype
            )
            latents = components.scheduler.add_noise(latents, noise, bs.latent_timestep)
        bs.latents = latents
        self.set_block_state(state, bs)
        return components, state


class StableDiffusionXLInpaintPrepareLatentsStep(StableDiffusionInpaintPrepareLatentsStep):
    """Initial latents and mask latents for inpainting, drawing from the generator in the classic order."""

    model_name = MODEL_NAME

    description = (
        "Draws the initial noise (pure noise at strength 1, else image_latents noised to latent_timestep; "
        "with denoising_start the image latents themselves), then downsamples the mask to the latent size "
        "and encodes the masked image; both are repeated to the batch and doubled when guidance is on."
    )

    inputs = [
        tensor_input("image_latents", "Scaled VAE latents of the image."),
        tensor_input("mask_condition", "The binarized mask.", required=True),
        tensor_input("masked_image", "The masked image."),
        LATENT_TIMESTEP,
        strength_input(INPAINT_STRENGTH),
        DENOISING_START,
        InputParam.template("latents"),
        InputParam.template("height"),
        InputParam.template("width"),
        *BATCH_INPUTS,
        DTYPE,
        guidance_scale_input(),
    ]

    def _initial(self, components, bs, total: int, strength: float):
        """(latents, noise) as the classic prepare_latents makes them."""
        device, dtype, generator = components._execution_device, bs.dtype, bs.generator
        scale = vae_scale_factor(components)
        shape = (
            total,
            components.vae.config.latent_channels,
            int(bs.height) // scale,
            int(bs.width) // scale,
        )
        if bs.denoising_start is not None:
            # Refiner-style start: the image latents are taken as partly denoised already.
            return bs.image_latents.to(device), randn_tensor(
                shape, generator=generator, device=device, dtype=dtype
            )
        if bs.latents is not None:
            noise = bs.latents.to(device)
            return noise * components.scheduler.init_noise_sigma, noise
        noise = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        if strength == 1.0:
            return noise * components.scheduler.init_noise_sigma, noise
        return components.scheduler.add_noise(bs.image_latents, noise, bs.latent_timestep), noise

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        total = bs.batch_size * bs.num_images_per_prompt
        check_generators(self, bs.generator, total)
        name = type(self).__name__
        strength = bs.strength  # the declared default fills a missing one
        if bs.image_latents is not None:
            # A repeated copy even for a factor of 1, as the classic pipeline makes.
            bs.image_latents = repeat_to_batch(bs.image_latents, total, f"{name}: image", copy=True)
        elif (bs.latents is None and strength != 1.0) or bs.denoising_start is not None:
            msg = f"{type(self).__name__}: strength {strength} < 1 starts from the image, but image_latents is missing"
            raise ValueError(msg)
        bs.latents, bs.noise = self._initial(components, bs, total, strength)

        device, dtype = components._execution_device, bs.dtype
        guided = do_classifier_free_guidance(components, guidance_scale(components, bs.guidance_scale))
        scale = vae_scale_factor(components)
        mask = torch.nn.functional.interpolate(
            bs.mask_condition, size=(bs.height // scale, bs.width // scale)
        )
        mask = repeat_to_batch(mask.to(device=device, dtype=dtype), total, f"{name}: mask_image")
        bs.mask = torch.cat([mask] * 2) if guided else mask
        masked = None
        if bs.masked_image is not None:
            # Encoded after the noise is drawn: the generator's draws keep the classic order.
            pixels = bs.masked_image.to(device=device, dtype=dtype)
            masked = repeat_to_batch(
                encode_image_latents(components.vae, pixels, bs.generator), total, f"{name}: image"
            )
            masked = (torch.cat([masked] * 2) if guided else masked).to(device=device, dtype=dtype)
        bs.masked_image_latents = masked
        self._check_unet(components, bs.mask, masked)
        self.set_block_state(state, bs)
        return components, state


def _time_ids_input(name: str, description: str) -> InputParam:
    return InputParam(name, type_hint=_SIZE, description=description)


_CONDITIONING_INPUTS = [
    _time_ids_input(
        "original_size", "The image size the model is told the source had (default: height, width)."
    ),
    _time_ids_input("target_size", "The image size the model is told to make (default: height, width)."),
    InputParam(
        "crops_coords_top_left", type_hint=_SIZE, default=(0, 0), description="The crop the model is told of."
    ),
    _time_ids_input("negative_original_size", "original_size for the unconditional prediction."),
    _time_ids_input("negative_target_size", "target_size for the unconditional prediction."),
    InputParam(
        "negative_crops_coords_top_left",
        type_hint=_SIZE,
        default=(0, 0),
        description="crops_coords_top_left for the unconditional prediction.",
    ),
    InputParam(
        "pooled_prompt_embeds", type_hint=torch.Tensor, required=True, description="Pooled embeddings."
    ),
    BATCH_SIZE,
    InputParam.template("num_images_per_prompt"),
    guidance_scale_input(),
    DTYPE,
]
_CONDITIONING_OUTPUTS = [
    OutputParam(
        "add_time_ids", type_hint=torch.Tensor, description="Micro-conditioning ids, one row per image."
    ),
    OutputParam(
        "negative_add_time_ids",
        type_hint=torch.Tensor,
        description="Ids for the unconditional prediction, or None.",
    ),
]


def _time_ids(
    components, values: list, pooled: torch.Tensor, dtype, block: ModularPipelineBlocks
) -> torch.Tensor:
    """One row of time ids, after checking that ids and pooled embedding fill the UNet's added embedding."""
    unet = components.unet
    passed = unet.config.addition_time_embed_dim * len(values) + pooled.shape[-1]
    expected = unet.add_embedding.linear_1.in_features
    if passed != expected:
        msg = (
            f"{type(block).__name__}: the UNet's added embedding takes {expected} values, but {len(values)} time ids "
            f"x {unet.config.addition_time_embed_dim} + a pooled embedding of {pooled.shape[-1]} make {passed}; "
            "a refiner UNet needs requires_aesthetics_score=True (5 ids), a base UNet False (6 ids)"
        )
        raise ValueError(msg)
    return torch.tensor([values], dtype=dtype)


class StableDiffusionXLPrepareAdditionalConditioningStep(ModularPipelineBlocks):
    """Text-to-image micro-conditioning: original size, crop and target size as time ids."""

    model_name = MODEL_NAME

    description = (
        "Makes add_time_ids = original_size + crops_coords_top_left + target_size (sizes default to height, "
        "width), and negative_add_time_ids for guidance (the same ids unless both negative sizes are given)."
    )

    expected_components = [ComponentSpec("unet", "diffusers.UNet2DConditionModel")]

    inputs = [InputParam.template("height"), InputParam.template("width"), *_CONDITIONING_INPUTS]

    intermediate_outputs = list(_CONDITIONING_OUTPUTS)

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        height, width = default_size(components, bs.height, bs.width)
        size = (height, width)
        values = [*(bs.original_size or size), *bs.crops_coords_top_left, *(bs.target_size or size)]
        dtype, pooled = bs.dtype, bs.pooled_prompt_embeds
        ids = _time_ids(components, values, pooled, dtype, self)
        negative = ids
        if bs.negative_original_size is not None and bs.negative_target_size is not None:
            negative_values = [
                *bs.negative_original_size,
                *bs.negative_crops_coords_top_left,
                *bs.negative_target_size,
            ]
            negative = _time_ids(components, negative_values, pooled, dtype, self)
        total = bs.batch_size * bs.num_images_per_prompt
        device = components._execution_device
        if do_classifier_free_guidance(components, guidance_scale(components, bs.guidance_scale)):
            # The classic pipeline repeats the [negative, positive] pair per image, so the guidance batch
            # [uncond..., cond...] sees the rows n, p, n, p, ...; halves of that keep its result bit for bit
            # (they differ from n..., p... only when negative sizes are given).
            rows = torch.cat([negative, ids]).to(device).repeat(total, 1)
            bs.negative_add_time_ids, bs.add_time_ids = rows[:total], rows[total:]
        else:
            bs.negative_add_time_ids, bs.add_time_ids = None, ids.to(device).repeat(total, 1)
        self.set_block_state(state, bs)
        return components, state


class StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep(ModularPipelineBlocks):
    """Image-to-image micro-conditioning, with aesthetic scores in place of the target size for a refiner."""

    model_name = MODEL_NAME

    description = (
        "Makes add_time_ids = original_size + crops_coords_top_left + target_size (sizes default to the "
        "latents' size), or original_size + crops_coords_top_left + aesthetic_score when the repo sets "
        "requires_aesthetics_score (refiners), and the negative ids likewise."
    )

    expected_components = [ComponentSpec("unet", "diffusers.UNet2DConditionModel")]

    expected_configs = [
        ConfigSpec(
            "requires_aesthetics_score",
            False,
            "Condition on aesthetic scores instead of the target size (SDXL refiner).",
        )
    ]

    inputs = [
        InputParam("latents", type_hint=torch.Tensor, required=True, description="The initial latents."),
        *_CONDITIONING_INPUTS,
        InputParam(
            "aesthetic_score", type_hint=float, default=6.0, description="Refiner: the score to aim at."
        ),
        InputParam(
            "negative_aesthetic_score",
            type_hint=float,
            default=2.5,
            description="Refiner: the score to avoid.",
        ),
    ]

    intermediate_outputs = list(_CONDITIONING_OUTPUTS)

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        scale = vae_scale_factor(components)
        size = (bs.latents.shape[-2] * scale, bs.latents.shape[-1] * scale)
        original, target = bs.original_size or size, bs.target_size or size
        negative_original = bs.negative_original_size or original
        negative_target = bs.negative_target_size or target
        crops = list(bs.crops_coords_top_left)
        if components.requires_aesthetics_score:
            values = [*original, *crops, bs.aesthetic_score]
            negative_values = [
                *negative_original,
                *bs.negative_crops_coords_top_left,
                bs.negative_aesthetic_score,
            ]
        else:
            # Without aesthetic scores the classic pipeline gives the negative ids the positive crop.
            values = [*original, *crops, *target]
            negative_values = [*negative_original, *crops, *negative_target]
        pooled, dtype = bs.pooled_prompt_embeds, bs.dtype
        ids = _time_ids(components, values, pooled, dtype, self)
        negative = _time_ids(components, negative_values, pooled, dtype, self)
        total = bs.batch_size * bs.num_images_per_prompt
        device = components._execution_device
        bs.add_time_ids = ids.repeat(total, 1).to(device)
        bs.negative_add_time_ids = None
        if do_classifier_free_guidance(components, guidance_scale(components, bs.guidance_scale)):
            bs.negative_add_time_ids = negative.repeat(total, 1).to(device)
        self.set_block_state(state, bs)
        return components, state
