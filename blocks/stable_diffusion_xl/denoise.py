"""The denoising loop: per step, prepare the UNet input, predict the noise with SDXL's added conditions, step;
for inpainting, the mask handling around it."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.ip_adapter import IP_ADAPTER_DENOISER_INPUTS, denoiser_ip_embeds
from blocks.common.params import tensor_input
from blocks.stable_diffusion.denoise import (
    StableDiffusionDenoiseLoopWrapper,
    StableDiffusionInpaintDenoiseStep,
    StableDiffusionInpaintLoopAfterDenoiser,
    StableDiffusionInpaintLoopBeforeDenoiser,
    StableDiffusionLoopAfterDenoiser,
    StableDiffusionLoopBeforeDenoiser,
    StableDiffusionLoopDenoiser,
)
from blocks.stable_diffusion.utils import do_classifier_free_guidance
from modular import InputParam

from .utils import MODEL_NAME, guidance_scale_input, with_sdxl_guidance

__all__ = [
    "StableDiffusionXLLoopBeforeDenoiser",
    "StableDiffusionXLInpaintLoopBeforeDenoiser",
    "StableDiffusionXLLoopDenoiser",
    "StableDiffusionXLLoopAfterDenoiser",
    "StableDiffusionXLInpaintLoopAfterDenoiser",
    "StableDiffusionXLDenoiseStep",
    "StableDiffusionXLInpaintDenoiseStep",
]


class StableDiffusionXLLoopBeforeDenoiser(StableDiffusionLoopBeforeDenoiser):
    """Loop step: duplicate the latents for guidance and scale them for the scheduler (SDXL's guidance default)."""

    model_name = MODEL_NAME

    inputs = with_sdxl_guidance(StableDiffusionLoopBeforeDenoiser.inputs)


class StableDiffusionXLInpaintLoopBeforeDenoiser(StableDiffusionInpaintLoopBeforeDenoiser):
    """Loop step for inpainting: as the plain one, plus mask and masked-image latents for a 9-channel UNet."""

    model_name = MODEL_NAME

    inputs = with_sdxl_guidance(StableDiffusionInpaintLoopBeforeDenoiser.inputs)


class StableDiffusionXLLoopDenoiser(StableDiffusionLoopDenoiser):
    """Loop step: the UNet with text embeddings, pooled embeddings and time ids; classifier-free guidance."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: runs the UNet on latent_model_input at t with prompt_embeds and the added conditions "
        "(text_embeds: pooled_prompt_embeds, time_ids: add_time_ids), negatives first when guidance is on; "
        "noise_pred = uncond + guidance_scale * (text - uncond), optionally rescaled by guidance_rescale."
    )

    inputs = [
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
        tensor_input("pooled_prompt_embeds", "Pooled text embeddings.", required=True),
        tensor_input("negative_pooled_prompt_embeds", "Pooled negative embeddings."),
        tensor_input("add_time_ids", "Micro-conditioning ids.", required=True),
        tensor_input("negative_add_time_ids", "Micro-conditioning ids of the unconditional prediction."),
        guidance_scale_input(),
        InputParam("guidance_rescale", type_hint=float, default=0.0, description="Guidance rescale factor."),
        InputParam.template("cross_attention_kwargs"),
        *IP_ADAPTER_DENOISER_INPUTS,
    ]

    def unet_conditions(self, components, block_state) -> tuple[torch.Tensor, dict[str, Any]]:
        """The text embeddings and added conditions of the (guidance-doubled) batch, made once per call."""
        if "unet_conditions" not in block_state:
            embeds = block_state.prompt_embeds
            pooled, time_ids = block_state.pooled_prompt_embeds, block_state.add_time_ids
            guided = do_classifier_free_guidance(components, block_state.guidance_scale)
            if guided:
                embeds = torch.cat([block_state.negative_prompt_embeds, embeds])
                pooled = torch.cat([block_state.negative_pooled_prompt_embeds, pooled])
                time_ids = torch.cat([block_state.negative_add_time_ids, time_ids])
            device = components._execution_device
            added = {"text_embeds": pooled.to(device), "time_ids": time_ids.to(device)}
            image_embeds = denoiser_ip_embeds(
                components, block_state, "unet", type(self).__name__, guided=guided
            )
            if image_embeds is not None:
                added["image_embeds"] = image_embeds
            block_state.unet_conditions = (embeds.to(device), {"added_cond_kwargs": added})
        return block_state.unet_conditions


class StableDiffusionXLLoopAfterDenoiser(StableDiffusionLoopAfterDenoiser):
    """Loop step: the scheduler step from t to the next timestep (as Stable Diffusion's)."""

    model_name = MODEL_NAME


class StableDiffusionXLInpaintLoopAfterDenoiser(StableDiffusionInpaintLoopAfterDenoiser):
    """Loop step for inpainting: as Stable Diffusion's, with SDXL's guidance default."""

    model_name = MODEL_NAME

    inputs = with_sdxl_guidance(StableDiffusionInpaintLoopAfterDenoiser.inputs)


class StableDiffusionXLDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [
        StableDiffusionXLLoopBeforeDenoiser,
        StableDiffusionXLLoopDenoiser,
        StableDiffusionXLLoopAfterDenoiser,
    ]

    description = (
        "Denoises the latents over the timesteps. Each step runs: before_denoiser (guidance doubling, "
        "scale_model_input), denoiser (UNet with SDXL's added conditions, guidance), after_denoiser "
        "(scheduler step)."
    )


class StableDiffusionXLInpaintDenoiseStep(StableDiffusionInpaintDenoiseStep):
    """The inpainting denoising loop, for 4- and 9-channel UNets, with SDXL's UNet conditions."""

    block_classes = [
        StableDiffusionXLInpaintLoopBeforeDenoiser,
        StableDiffusionXLLoopDenoiser,
        StableDiffusionXLInpaintLoopAfterDenoiser,
    ]
