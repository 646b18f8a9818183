"""The denoising loop: per step, prepare the UNet input, predict the noise with SDXL's added conditions, step;
for inpainting, the mask handling around it."""

from __future__ import annotations

from typing import Any

from blocks.common.callback_tensors import GuidanceBatch
from blocks.common.guidance import guider_spec
from blocks.common.latent_preview import SDXL_LATENT_RGB
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

from .utils import GUIDANCE_SCALE, MODEL_NAME, guidance_scale, guidance_scale_input, with_sdxl_guidance

# The classic SDXL pipelines' guidance: classifier-free, scale 5.0 (the call's guidance_scale sets it per call).
SDXL_GUIDER_SPEC = guider_spec(guidance_scale=5.0)

# What the classic SDXL pipelines offer a step callback, and the tensors they join into one classifier-free batch
# (``cat([negative, positive])``) before their loop: the text embeddings, the pooled ones as ``add_text_embeds``,
# and the micro-conditioning ids (whose halves keep the classic rows, see the conditioning steps).
SDXL_CALLBACK_TENSOR_INPUTS = ("latents", "prompt_embeds", "add_text_embeds", "add_time_ids")
SDXL_GUIDANCE_BATCHES = (
    GuidanceBatch("prompt_embeds", "prompt_embeds", "negative_prompt_embeds"),
    GuidanceBatch("add_text_embeds", "pooled_prompt_embeds", "negative_pooled_prompt_embeds"),
    GuidanceBatch("add_time_ids", "add_time_ids", "negative_add_time_ids"),
)

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
    """Loop step: the UNet with text embeddings, pooled embeddings and time ids, per guidance condition."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: asks the guider (default ClassifierFreeGuidance) which conditions to predict at t and "
        "runs the UNet on latent_model_input with each condition's prompt_embeds and added conditions "
        "(text_embeds: pooled_prompt_embeds, time_ids: add_time_ids; the negatives for the unconditional one); "
        "conditions that leave the model as it is share one batch, negatives first (PAG's perturbed one joins it last). By default "
        "noise_pred = uncond + guidance_scale * (text - uncond), optionally rescaled by guidance_rescale."
    )

    expected_components = [SDXL_GUIDER_SPEC, *StableDiffusionLoopDenoiser.expected_components[1:]]

    inputs = [
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
        tensor_input("pooled_prompt_embeds", "Pooled text embeddings.", required=True),
        tensor_input("negative_pooled_prompt_embeds", "Pooled negative embeddings."),
        tensor_input("add_time_ids", "Micro-conditioning ids.", required=True),
        tensor_input("negative_add_time_ids", "Micro-conditioning ids of the unconditional prediction."),
        guidance_scale_input(),
        *StableDiffusionLoopDenoiser.inputs[3:],
    ]

    def condition_inputs(self, components, block_state) -> dict[str, tuple[Any, Any]]:
        """Per UNet input, its (conditional, unconditional) value on the execution device, made once per call
        and again when a step callback replaces an embedding or turns guidance off."""
        guided = do_classifier_free_guidance(
            components, guidance_scale(components, block_state.guidance_scale)
        )
        sources = (guided, *(block_state.__dict__.get(name) for name in _CONDITION_SOURCES))
        made_from = block_state.__dict__.get("condition_inputs_sources")
        if made_from is None or any(a is not b for a, b in zip(made_from, sources, strict=True)):
            block_state.condition_inputs_sources = sources
            inputs = super().condition_inputs(components, block_state)
            device = components._execution_device
            pairs = {
                "text_embeds": (block_state.pooled_prompt_embeds, block_state.negative_pooled_prompt_embeds),
                "time_ids": (block_state.add_time_ids, block_state.negative_add_time_ids),
            }
            for name, (positive, negative) in pairs.items():
                # Without guidance the conditional value stands in for the unconditional one (see SD's).
                inputs[name] = (positive.to(device), (negative if guided else positive).to(device))
            positive, negative = inputs["encoder_hidden_states"]
            inputs["encoder_hidden_states"] = (positive.to(device), negative.to(device))
            block_state.condition_inputs = inputs
        return block_state.condition_inputs

    def added_conditions(self, stacked: dict[str, Any]) -> dict[str, Any]:
        """SDXL's ``added_cond_kwargs``: pooled embeddings, time ids and any image prompts."""
        added = {"text_embeds": stacked["text_embeds"], "time_ids": stacked["time_ids"]}
        if stacked["image_embeds"] is not None:
            added["image_embeds"] = stacked["image_embeds"]
        return {"added_cond_kwargs": added}


# What the cached UNet inputs are made from (compared by identity: a callback's tensor is a new object).
_CONDITION_SOURCES = (
    "prompt_embeds",
    "negative_prompt_embeds",
    "pooled_prompt_embeds",
    "negative_pooled_prompt_embeds",
    "add_time_ids",
    "negative_add_time_ids",
)


class StableDiffusionXLLoopAfterDenoiser(StableDiffusionLoopAfterDenoiser):
    """Loop step: the scheduler step from t to the next timestep (as Stable Diffusion's)."""

    model_name = MODEL_NAME


class StableDiffusionXLInpaintLoopAfterDenoiser(StableDiffusionInpaintLoopAfterDenoiser):
    """Loop step for inpainting: as Stable Diffusion's, with SDXL's guidance default."""

    model_name = MODEL_NAME

    inputs = with_sdxl_guidance(StableDiffusionInpaintLoopAfterDenoiser.inputs)


class StableDiffusionXLDenoiseStep(StableDiffusionDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    _callback_tensor_inputs = SDXL_CALLBACK_TENSOR_INPUTS
    guidance_batches = SDXL_GUIDANCE_BATCHES
    classic_guidance_scale = GUIDANCE_SCALE

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

    # SDXL's VAE has a latent space of its own (blocks/common/latent_preview.py).
    latent_rgb_map = SDXL_LATENT_RGB


class StableDiffusionXLInpaintDenoiseStep(StableDiffusionInpaintDenoiseStep):
    """The inpainting denoising loop, for 4- and 9-channel UNets, with SDXL's UNet conditions."""

    _callback_tensor_inputs = (*SDXL_CALLBACK_TENSOR_INPUTS, "mask", "masked_image_latents")
    guidance_batches = SDXL_GUIDANCE_BATCHES
    classic_guidance_scale = GUIDANCE_SCALE

    block_classes = [
        StableDiffusionXLInpaintLoopBeforeDenoiser,
        StableDiffusionXLLoopDenoiser,
        StableDiffusionXLInpaintLoopAfterDenoiser,
    ]

    latent_rgb_map = SDXL_LATENT_RGB
