"""The denoising loop: per step, prepare the UNet input, predict the noise with SDXL's added conditions, step."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import UNet2DConditionModel

from blocks.stable_diffusion.denoise import (
    StableDiffusionDenoiseLoopWrapper,
    StableDiffusionLoopAfterDenoiser,
    StableDiffusionLoopBeforeDenoiser,
    StableDiffusionLoopDenoiser,
)
from blocks.stable_diffusion.utils import do_classifier_free_guidance
from modular import ComponentSpec, InputParam

from .utils import MODEL_NAME, guidance_scale_input

__all__ = [
    "StableDiffusionXLLoopBeforeDenoiser",
    "StableDiffusionXLLoopDenoiser",
    "StableDiffusionXLLoopAfterDenoiser",
    "StableDiffusionXLDenoiseStep",
]

_UNET = ComponentSpec("unet", UNet2DConditionModel)


def _tensor(name: str, description: str, required: bool = False) -> InputParam:
    return InputParam(name, type_hint=torch.Tensor, required=required, description=description)


class StableDiffusionXLLoopBeforeDenoiser(StableDiffusionLoopBeforeDenoiser):
    """Loop step: duplicate the latents for guidance and scale them for the scheduler (SDXL's guidance default)."""

    model_name = MODEL_NAME

    @property
    def inputs(self) -> list[InputParam]:
        return [_tensor("latents", "The latents being denoised.", required=True), guidance_scale_input()]


class StableDiffusionXLLoopDenoiser(StableDiffusionLoopDenoiser):
    """Loop step: the UNet with text embeddings, pooled embeddings and time ids; classifier-free guidance."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Inside the loop: runs the UNet on latent_model_input at t with prompt_embeds and the added conditions "
            "(text_embeds: pooled_prompt_embeds, time_ids: add_time_ids), negatives first when guidance is on; "
            "noise_pred = uncond + guidance_scale * (text - uncond), optionally rescaled by guidance_rescale."
        )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("prompt_embeds", required=True),
            InputParam.template("negative_prompt_embeds"),
            _tensor("pooled_prompt_embeds", "Pooled text embeddings.", required=True),
            _tensor("negative_pooled_prompt_embeds", "Pooled negative embeddings."),
            _tensor("add_time_ids", "Micro-conditioning ids.", required=True),
            _tensor("negative_add_time_ids", "Micro-conditioning ids of the unconditional prediction."),
            guidance_scale_input(),
            InputParam(
                "guidance_rescale", type_hint=float, default=0.0, description="Guidance rescale factor."
            ),
            InputParam.template("cross_attention_kwargs"),
        ]

    def unet_conditions(self, components, block_state) -> tuple[torch.Tensor, dict[str, Any]]:
        """The text embeddings and added conditions of the (guidance-doubled) batch, made once per call."""
        if "unet_conditions" not in block_state:
            embeds = block_state.prompt_embeds
            pooled, time_ids = block_state.pooled_prompt_embeds, block_state.add_time_ids
            if do_classifier_free_guidance(components, block_state.guidance_scale):
                embeds = torch.cat([block_state.negative_prompt_embeds, embeds])
                pooled = torch.cat([block_state.negative_pooled_prompt_embeds, pooled])
                time_ids = torch.cat([block_state.negative_add_time_ids, time_ids])
            device = components._execution_device
            added = {"text_embeds": pooled.to(device), "time_ids": time_ids.to(device)}
            block_state.unet_conditions = (embeds.to(device), {"added_cond_kwargs": added})
        return block_state.unet_conditions


class StableDiffusionXLLoopAfterDenoiser(StableDiffusionLoopAfterDenoiser):
    """Loop step: the scheduler step from t to the next timestep (as Stable Diffusion's)."""

    model_name = MODEL_NAME


class StableDiffusionXLDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [
        StableDiffusionXLLoopBeforeDenoiser,
        StableDiffusionXLLoopDenoiser,
        StableDiffusionXLLoopAfterDenoiser,
    ]
    block_names = ["before_denoiser", "denoiser", "after_denoiser"]

    @property
    def description(self) -> str:
        return (
            "Denoises the latents over the timesteps. Each step runs: before_denoiser (guidance doubling, "
            "scale_model_input), denoiser (UNet with SDXL's added conditions, guidance), after_denoiser "
            "(scheduler step)."
        )
