"""The denoising loop: per step, prepare the UNet input, predict the noise with guidance, step the scheduler."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import UNet2DConditionModel

from blocks.common import TimestepLoopBlocks
from blocks.common.ip_adapter import IP_ADAPTER_DENOISER_INPUTS, denoiser_ip_embeds
from modular import (
    ComponentSpec,
    InputParam,
    ModularPipelineBlocks,
)

from .utils import MODEL_NAME, SCHEDULER, do_classifier_free_guidance, extra_step_kwargs

__all__ = [
    "StableDiffusionLoopBeforeDenoiser",
    "StableDiffusionInpaintLoopBeforeDenoiser",
    "StableDiffusionLoopDenoiser",
    "StableDiffusionLoopAfterDenoiser",
    "StableDiffusionInpaintLoopAfterDenoiser",
    "StableDiffusionDenoiseLoopWrapper",
    "StableDiffusionDenoiseStep",
    "StableDiffusionInpaintDenoiseStep",
]

_UNET = ComponentSpec("unet", UNet2DConditionModel)


def guidance_scale_embedding(scale: torch.Tensor, embedding_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoidal embedding of guidance scales [B] -> [B, embedding_dim], for UNets with time_cond_proj_dim."""
    scale = scale * 1000.0
    half = embedding_dim // 2
    freq = torch.exp(torch.arange(half, dtype=dtype) * -(torch.log(torch.tensor(10000.0)) / (half - 1)))
    emb = scale.to(dtype)[:, None] * freq[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
    if embedding_dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb


class StableDiffusionLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: duplicate the latents for guidance and scale them for the scheduler."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: makes latent_model_input from latents (doubled when guidance is on), scaled "
        "with the scheduler's scale_model_input for timestep t."
    )

    expected_components = [_UNET, SCHEDULER]

    inputs = [
        InputParam(
            "latents", type_hint=torch.Tensor, required=True, description="The latents being denoised."
        ),
        InputParam.template("guidance_scale"),
    ]

    def __call__(self, components, block_state, i, t):
        latents = block_state.latents
        if do_classifier_free_guidance(components, block_state.guidance_scale):
            latents = torch.cat([latents] * 2)
        block_state.latent_model_input = components.scheduler.scale_model_input(latents, t)
        return components, block_state


class StableDiffusionInpaintLoopBeforeDenoiser(StableDiffusionLoopBeforeDenoiser):
    """Loop step for inpainting: as the plain one, plus mask and masked-image latents for a 9-channel UNet."""

    description = (
        "Inside the loop: as StableDiffusionLoopBeforeDenoiser; for a 9-channel UNet, appends mask and "
        "masked_image_latents to latent_model_input along the channels."
    )

    inputs = [
        *StableDiffusionLoopBeforeDenoiser.inputs,
        InputParam("mask", type_hint=torch.Tensor, required=True, description="The mask at latent size."),
        InputParam(
            "masked_image_latents", type_hint=torch.Tensor, description="Latents of the masked image."
        ),
    ]

    def __call__(self, components, block_state, i, t):
        components, block_state = super().__call__(components, block_state, i, t)
        if components.unet.config.in_channels == 9:
            block_state.latent_model_input = torch.cat(
                [block_state.latent_model_input, block_state.mask, block_state.masked_image_latents], dim=1
            )
        return components, block_state


class StableDiffusionLoopDenoiser(ModularPipelineBlocks):
    """Loop step: predict the noise with the UNet and combine the two halves for classifier-free guidance."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: runs the UNet on latent_model_input at t with the text embeddings; with guidance, "
        "noise_pred = uncond + guidance_scale * (text - uncond), optionally rescaled by guidance_rescale."
    )

    expected_components = [_UNET]

    inputs = [
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
        InputParam.template("guidance_scale"),
        InputParam("guidance_rescale", type_hint=float, default=0.0, description="Guidance rescale factor."),
        InputParam.template("cross_attention_kwargs"),
        *IP_ADAPTER_DENOISER_INPUTS,
    ]

    def _timestep_cond(self, components, block_state) -> torch.Tensor | None:
        proj_dim = components.unet.config.time_cond_proj_dim
        if proj_dim is None:
            return None
        if "timestep_cond" not in block_state:
            batch = block_state.latents.shape[0]
            scale = torch.tensor(block_state.guidance_scale - 1).repeat(batch)
            block_state.timestep_cond = guidance_scale_embedding(scale, proj_dim, torch.float32).to(
                device=block_state.latents.device, dtype=block_state.latents.dtype
            )
        return block_state.timestep_cond

    def unet_conditions(self, components, block_state) -> tuple[torch.Tensor, dict[str, Any]]:
        """The text embeddings of the (guidance-doubled) batch, negatives first, and extra UNet inputs."""
        embeds = block_state.prompt_embeds
        guided = do_classifier_free_guidance(components, block_state.guidance_scale)
        if guided:
            embeds = torch.cat([block_state.negative_prompt_embeds, embeds])
        image_embeds = denoiser_ip_embeds(components, block_state, "unet", type(self).__name__, guided=guided)
        return embeds, {} if image_embeds is None else {"added_cond_kwargs": {"image_embeds": image_embeds}}

    def __call__(self, components, block_state, i, t):
        guided = do_classifier_free_guidance(components, block_state.guidance_scale)
        embeds, extra = self.unet_conditions(components, block_state)
        noise_pred = components.unet(
            block_state.latent_model_input,
            t,
            encoder_hidden_states=embeds,
            timestep_cond=self._timestep_cond(components, block_state),
            cross_attention_kwargs=block_state.cross_attention_kwargs,
            return_dict=False,
            **extra,
        )[0]
        if guided:
            uncond, text = noise_pred.chunk(2)
            noise_pred = uncond + block_state.guidance_scale * (text - uncond)
            if block_state.guidance_rescale > 0.0:
                noise_pred = _rescale_noise_cfg(noise_pred, text, block_state.guidance_rescale)
        block_state.noise_pred = noise_pred
        return components, block_state


def _rescale_noise_cfg(
    noise_cfg: torch.Tensor, noise_pred_text: torch.Tensor, guidance_rescale: float
) -> torch.Tensor:
    """Match the guided prediction's spread to the text prediction's (Lin et al. 2023, sec. 3.4), then blend."""
    std_text = noise_pred_text.std(dim=list(range(1, noise_pred_text.ndim)), keepdim=True)
    std_cfg = noise_cfg.std(dim=list(range(1, noise_cfg.ndim)), keepdim=True)
    rescaled = noise_cfg * (std_text / std_cfg)
    return guidance_rescale * rescaled + (1 - guidance_rescale) * noise_cfg


class StableDiffusionLoopAfterDenoiser(ModularPipelineBlocks):
    """Loop step: the scheduler step from t to the next timestep."""

    model_name = MODEL_NAME

    description = "Inside the loop: latents = scheduler.step(noise_pred, t, latents) (with eta and generator where taken)."

    expected_components = [SCHEDULER]

    inputs = [InputParam.template("generator"), InputParam.template("eta")]

    def __call__(self, components, block_state, i, t):
        scheduler = components.scheduler
        kwargs = extra_step_kwargs(scheduler, block_state.generator, block_state.eta)
        block_state.latents = scheduler.step(
            block_state.noise_pred, t, block_state.latents, **kwargs, return_dict=False
        )[0]
        return components, block_state


class StableDiffusionInpaintLoopAfterDenoiser(StableDiffusionLoopAfterDenoiser):
    """Loop step for inpainting: the scheduler step, then, for a 4-channel UNet, paste back the kept area."""

    description = (
        "Inside the loop: the scheduler step; for a 4-channel UNet the area outside the mask is then "
        "replaced by image_latents noised to the next timestep."
    )

    expected_components = [_UNET, SCHEDULER]

    inputs = [
        *StableDiffusionLoopAfterDenoiser.inputs,
        InputParam("mask", type_hint=torch.Tensor, required=True, description="The mask at latent size."),
        InputParam("image_latents", type_hint=torch.Tensor, description="Scaled VAE latents of the image."),
        InputParam("noise", type_hint=torch.Tensor, description="The noise the latents started from."),
        InputParam.template("guidance_scale"),
    ]

    def __call__(self, components, block_state, i, t):
        components, block_state = super().__call__(components, block_state, i, t)
        if components.unet.config.in_channels != 4:
            return components, block_state
        mask = block_state.mask
        if do_classifier_free_guidance(components, block_state.guidance_scale):
            mask, _ = mask.chunk(2)
        kept = block_state.image_latents
        if i < len(block_state.timesteps) - 1:
            next_t = block_state.timesteps[i + 1]
            kept = components.scheduler.add_noise(kept, block_state.noise, torch.tensor([next_t]))
        block_state.latents = (1 - mask) * kept + mask * block_state.latents
        return components, block_state


class StableDiffusionDenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop with its own denoiser and scheduler."""

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, _UNET]


class StableDiffusionDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [
        StableDiffusionLoopBeforeDenoiser,
        StableDiffusionLoopDenoiser,
        StableDiffusionLoopAfterDenoiser,
    ]

    description = (
        "Denoises the latents over the timesteps. Each step runs: before_denoiser (guidance doubling, "
        "scale_model_input), denoiser (UNet and guidance), after_denoiser (scheduler step)."
    )


class StableDiffusionInpaintDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The inpainting denoising loop, for 4- and 9-channel UNets."""

    block_classes = [
        StableDiffusionInpaintLoopBeforeDenoiser,
        StableDiffusionLoopDenoiser,
        StableDiffusionInpaintLoopAfterDenoiser,
    ]

    description = (
        "Denoises the latents for inpainting. A 9-channel UNet sees the mask and the masked image each step; "
        "with a 4-channel UNet the area outside the mask is pasted back after each step."
    )
