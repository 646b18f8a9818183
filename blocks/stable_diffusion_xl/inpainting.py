"""Inpainting steps: image and mask encoding, initial and mask latents, and the mask handling in the loop."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.utils.torch_utils import randn_tensor

from blocks.stable_diffusion.denoise import (
    StableDiffusionDenoiseLoopWrapper,
    StableDiffusionInpaintLoopAfterDenoiser,
)
from blocks.stable_diffusion.encoders import IMAGE_PROCESSOR, MASK_PROCESSOR
from blocks.stable_diffusion.utils import (
    SCHEDULER,
    default_size,
    do_classifier_free_guidance,
    image_processor_for_vae,
    vae_scale_factor,
)
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .denoise import (
    StableDiffusionXLLoopBeforeDenoiser,
    StableDiffusionXLLoopDenoiser,
)
from .timesteps import StableDiffusionXLImg2ImgSetTimestepsStep
from .utils import (
    MODEL_NAME,
    batch_input,
    dtype_input,
    encode_image_latents,
    guidance_scale_input,
    strength_input,
)

__all__ = [
    "StableDiffusionXLInpaintVaeEncoderStep",
    "StableDiffusionXLInpaintSetTimestepsStep",
    "StableDiffusionXLInpaintPrepareLatentsStep",
    "StableDiffusionXLInpaintLoopBeforeDenoiser",
    "StableDiffusionXLInpaintLoopAfterDenoiser",
    "StableDiffusionXLInpaintDenoiseStep",
]

# The classic inpainting pipeline's default strength: just below 1, so the image's latents seed the noise.
INPAINT_STRENGTH = 0.9999
_VAE, _UNET = ComponentSpec("vae", AutoencoderKL), ComponentSpec("unet", UNet2DConditionModel)


def _tensor(name: str, description: str, required: bool = False) -> InputParam:
    return InputParam(name, type_hint=torch.Tensor, required=required, description=description)


def _repeat(
    tensor: torch.Tensor, total: int, what: str, block: ModularPipelineBlocks, always: bool = False
) -> torch.Tensor:
    """`tensor` repeated along dim 0 to `total`; with `always`, a repeated copy even for a factor of 1."""
    if tensor.shape[0] >= total and not always:
        return tensor
    if total % tensor.shape[0] != 0:
        msg = (
            f"{type(block).__name__}: {tensor.shape[0]} {what} cannot be repeated to a batch of {total} "
            f"(prompts x num_images_per_prompt); pass 1 or {total}"
        )
        raise ValueError(msg)
    return tensor.repeat(total // tensor.shape[0], 1, 1, 1)


class StableDiffusionXLInpaintVaeEncoderStep(ModularPipelineBlocks):
    """Inpainting: preprocess image and mask; encode the image when the UNet or the strength needs it."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Preprocesses `image` and `mask_image` to height x width, makes the masked image (the image where the "
            "mask is below 0.5), and encodes the image into image_latents when needed: for a 4-channel UNet "
            "(pasted back each step) or a strength below 1 (noised start). The masked image is encoded later, "
            "after the noise is drawn, so the generator is used in the classic order."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [_VAE, _UNET, IMAGE_PROCESSOR, MASK_PROCESSOR]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("image", required=True),
            InputParam.template("mask_image", required=True),
            InputParam.template("height"),
            InputParam.template("width"),
            strength_input(),
            InputParam.template("latents"),
            InputParam.template("generator"),
            dtype_input(),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam(
                "image_latents",
                type_hint=torch.Tensor,
                description="Scaled VAE latents of the image, or None.",
            ),
            OutputParam(
                "mask_condition", type_hint=torch.Tensor, description="The binarized mask, [B, 1, H, W]."
            ),
            OutputParam(
                "masked_image", type_hint=torch.Tensor, description="The image with the masked area zeroed."
            ),
            OutputParam("height", type_hint=int, description="The image height in pixels."),
            OutputParam("width", type_hint=int, description="The image width in pixels."),
        ]

    @torch.no_grad()
    def __call__(self, components, state):
        bs = self.get_block_state(state)
        height, width = default_size(components, bs.height, bs.width)
        image = image_processor_for_vae(components).preprocess(bs.image, height=height, width=width)
        image = image.to(dtype=torch.float32)
        mask = image_processor_for_vae(components, "mask_processor").preprocess(
            bs.mask_image, height=height, width=width
        )
        strength = INPAINT_STRENGTH if bs.strength is None else bs.strength
        dtype = bs.dtype or components.vae.dtype
        bs.image_latents = None
        if image.shape[1] == 4:
            bs.image_latents = image.to(device=components._execution_device, dtype=dtype)
        elif components.unet.config.in_channels == 4 or (bs.latents is None and strength != 1.0):
            pixels = image.to(device=components._execution_device, dtype=dtype)
            bs.image_latents = encode_image_latents(components.vae, pixels, bs.generator)
        bs.masked_image = None if image.shape[1] == 4 else image * (mask < 0.5)
        bs.mask_condition, bs.height, bs.width = mask, height, width
        self.set_block_state(state, bs)
        return components, state


class StableDiffusionXLInpaintSetTimestepsStep(StableDiffusionXLImg2ImgSetTimestepsStep):
    """Image-to-image timesteps with inpainting's default strength of 0.9999."""

    default_strength = INPAINT_STRENGTH


class StableDiffusionXLInpaintPrepareLatentsStep(ModularPipelineBlocks):
    """Initial latents and mask latents for inpainting, drawing from the generator in the classic order."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Draws the initial noise (pure noise at strength 1, else image_latents noised to latent_timestep; "
            "with denoising_start the image latents themselves), then downsamples the mask to the latent size "
            "and encodes the masked image; both are repeated to the batch and doubled when guidance is on."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [_VAE, _UNET, SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            _tensor("image_latents", "Scaled VAE latents of the image."),
            _tensor("mask_condition", "The binarized mask.", required=True),
            _tensor("masked_image", "The masked image."),
            _tensor("latent_timestep", "The first timestep.", required=True),
            strength_input(),
            InputParam("denoising_start", type_hint=float, description="Start fraction of the denoising."),
            InputParam.template("latents"),
            InputParam.template("height"),
            InputParam.template("width"),
            InputParam.template("generator"),
            batch_input(),
            InputParam.template("num_images_per_prompt"),
            dtype_input(),
            guidance_scale_input(),
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
        full = strength == 1.0
        if bs.denoising_start is not None:
            # Refiner-style start: the image latents are taken as partly denoised already.
            return bs.image_latents.to(device), randn_tensor(
                shape, generator=generator, device=device, dtype=dtype
            )
        if bs.latents is not None:
            noise = bs.latents.to(device)
            return noise * components.scheduler.init_noise_sigma, noise
        noise = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        if full:
            return noise * components.scheduler.init_noise_sigma, noise
        return components.scheduler.add_noise(bs.image_latents, noise, bs.latent_timestep), noise

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        total = bs.batch_size * bs.num_images_per_prompt
        if isinstance(bs.generator, list) and len(bs.generator) != total:
            msg = f"{type(self).__name__}: a list of generators needs one per image (got {len(bs.generator)} for a batch of {total})"
            raise ValueError(msg)
        strength = INPAINT_STRENGTH if bs.strength is None else bs.strength
        if bs.image_latents is not None:
            # Tensor.repeat even for a factor of 1, as the classic: it makes the VAE's channels-last output
            # contiguous, and convolutions round differently per memory layout.
            bs.image_latents = _repeat(bs.image_latents, total, "images", self, always=True)
        elif (bs.latents is None and strength != 1.0) or bs.denoising_start is not None:
            msg = f"{type(self).__name__}: strength {strength} < 1 starts from the image, but image_latents is missing"
            raise ValueError(msg)
        bs.latents, bs.noise = self._initial(components, bs, total, strength)

        device, dtype = components._execution_device, bs.dtype
        guided = do_classifier_free_guidance(components, bs.guidance_scale)
        scale = vae_scale_factor(components)
        mask = torch.nn.functional.interpolate(
            bs.mask_condition, size=(bs.height // scale, bs.width // scale)
        )
        mask = _repeat(mask.to(device=device, dtype=dtype), total, "masks", self)
        bs.mask = torch.cat([mask] * 2) if guided else mask
        masked = None
        if bs.masked_image is not None:
            # Encoded after the noise is drawn: the generator's draws keep the classic order.
            pixels = bs.masked_image.to(device=device, dtype=dtype)
            masked = _repeat(
                encode_image_latents(components.vae, pixels, bs.generator), total, "images", self
            )
            masked = (torch.cat([masked] * 2) if guided else masked).to(device=device, dtype=dtype)
        bs.masked_image_latents = masked
        self._check_unet(components, bs.mask, masked)
        self.set_block_state(state, bs)
        return components, state

    def _check_unet(self, components, mask: torch.Tensor, masked: torch.Tensor | None) -> None:
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


class StableDiffusionXLInpaintLoopBeforeDenoiser(StableDiffusionXLLoopBeforeDenoiser):
    """Loop step for inpainting: as the plain one, plus mask and masked-image latents for a 9-channel UNet."""

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *super().inputs,
            _tensor("mask", "The mask at latent size.", required=True),
            _tensor("masked_image_latents", "Latents of the masked image."),
        ]

    def __call__(self, components, block_state, i, t):
        components, block_state = super().__call__(components, block_state, i, t)
        if components.unet.config.in_channels == 9:
            block_state.latent_model_input = torch.cat(
                [block_state.latent_model_input, block_state.mask, block_state.masked_image_latents], dim=1
            )
        return components, block_state


class StableDiffusionXLInpaintLoopAfterDenoiser(StableDiffusionInpaintLoopAfterDenoiser):
    """Loop step for inpainting: as Stable Diffusion's, with SDXL's guidance default."""

    model_name = MODEL_NAME

    @property
    def inputs(self) -> list[InputParam]:
        return [p if p.name != "guidance_scale" else guidance_scale_input() for p in super().inputs]


class StableDiffusionXLInpaintDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The inpainting denoising loop, for 4- and 9-channel UNets."""

    block_classes = [
        StableDiffusionXLInpaintLoopBeforeDenoiser,
        StableDiffusionXLLoopDenoiser,
        StableDiffusionXLInpaintLoopAfterDenoiser,
    ]
    block_names = ["before_denoiser", "denoiser", "after_denoiser"]

    @property
    def description(self) -> str:
        return (
            "Denoises the latents for inpainting. A 9-channel UNet sees the mask and the masked image each step; "
            "with a 4-channel UNet the area outside the mask is pasted back after each step."
        )
