"""The denoising loop: per step, the transformer's input, the guided prediction (skip-layer guidance optional),
and the flow-matching Euler step; inpainting adds the mask channels or pastes back the kept area."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import SchedulerStepAfterDenoiser, TimestepLoopBlocks
from blocks.common.callback_tensors import GuidanceBatch, present, take
from blocks.common.guidance import (
    GuiderKindCheck,
    call_guider,
    check_guider,
    guided_prediction,
    guider_spec,
    stack_conditions,
)
from blocks.common.latent_preview import SD3_LATENT_RGB
from modular import ComponentSpec, InputParam, ModularPipelineBlocks

from .utils import (
    GUIDANCE_SCALE,
    MODEL_NAME,
    SCHEDULER,
    TRANSFORMER,
    do_classifier_free_guidance,
    guidance_scale,
    guidance_scale_input,
    pooled_input,
)

__all__ = [
    "SKIP_LAYER_INPUTS",
    "StableDiffusion3LoopBeforeDenoiser",
    "StableDiffusion3InpaintLoopBeforeDenoiser",
    "StableDiffusion3LoopDenoiser",
    "StableDiffusion3LoopAfterDenoiser",
    "StableDiffusion3InpaintLoopAfterDenoiser",
    "StableDiffusion3DenoiseLoopWrapper",
    "StableDiffusion3DenoiseStep",
    "StableDiffusion3InpaintDenoiseStep",
]

# The classic pipelines' guidance: classifier-free, pred = uncond + scale * (cond - uncond), scale 7.0.
GUIDER_SPEC = guider_spec(guidance_scale=GUIDANCE_SCALE)

SKIP_LAYER_INPUTS = (
    InputParam(
        "skip_guidance_layers",
        type_hint=list[int],
        description=(
            "Transformer layers to skip for skip-layer guidance (e.g. [7, 8, 9] for SD 3.5 Medium); default: "
            "none, no skip-layer guidance. Runs only with classifier-free guidance on."
        ),
    ),
    InputParam(
        "skip_layer_guidance_scale",
        type_hint=float,
        default=2.8,
        description="How strongly the prediction moves away from the one with the layers skipped.",
    ),
    InputParam(
        "skip_layer_guidance_start",
        type_hint=float,
        default=0.01,
        description="Skip-layer guidance runs at steps i with start * steps < i < stop * steps.",
    ),
    InputParam(
        "skip_layer_guidance_stop", type_hint=float, default=0.2, description="See skip_layer_guidance_start."
    ),
)

_LATENTS = InputParam(
    "latents", type_hint=torch.Tensor, required=True, description="The latents being denoised."
)
_MASK = InputParam("mask", type_hint=torch.Tensor, required=True, description="The mask at latent size.")


def reads_mask_channels(components: Any) -> bool:
    """Whether the transformer reads the mask and the masked image beside the latents (an inpainting model,
    latents + 1 + latents channels; SD3's is 33)."""
    return components.transformer.config.in_channels == 2 * components.vae.config.latent_channels + 1


class StableDiffusion3LoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: the transformer reads the latents as they are."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: latent_model_input = latents (the denoiser batches one copy per condition)."
    )

    inputs = [_LATENTS]

    def __call__(self, components, block_state, i, t):
        block_state.latent_model_input = block_state.latents
        return components, block_state


class StableDiffusion3InpaintLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step for inpainting: an inpainting transformer also reads the mask and the masked image's latents."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: latent_model_input = latents, with mask and masked_image_latents appended along the "
        "channels for an inpainting transformer (SD3's 33 input channels)."
    )

    expected_components = [TRANSFORMER]

    inputs = [
        _LATENTS,
        _MASK,
        InputParam(
            "masked_image_latents", type_hint=torch.Tensor, description="Latents of the masked image."
        ),
    ]

    def __call__(self, components, block_state, i, t):
        latents = block_state.latents
        if reads_mask_channels(components):
            latents = torch.cat([latents, block_state.mask, block_state.masked_image_latents], dim=1)
        block_state.latent_model_input = latents
        return components, block_state


class StableDiffusion3LoopDenoiser(GuiderKindCheck, ModularPipelineBlocks):
    """Loop step: the transformer's prediction per condition the guider asks for, combined by the guider."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: asks the guider (default ClassifierFreeGuidance) which conditions to predict at t, runs "
        "the transformer on latent_model_input with each condition's embeddings and pooled embeddings "
        "(conditions that leave the model as it is share one batch, negatives first, as the classic pipelines "
        "batch them) and combines them: noise_pred = uncond + guidance_scale * (cond - uncond) by default. With "
        "skip_guidance_layers and guidance on, at steps inside the start/stop window, a pass on the prompt with "
        "those layers skipped adds (cond - skipped) * skip_layer_guidance_scale, as StableDiffusion3Pipeline does."
    )

    expected_components = [GUIDER_SPEC, TRANSFORMER]

    inputs = [
        InputParam.template("prompt_embeds", required=True),
        pooled_input("pooled_prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
        pooled_input("negative_pooled_prompt_embeds"),
        guidance_scale_input(),
        *SKIP_LAYER_INPUTS,
        InputParam(
            "joint_attention_kwargs",
            type_hint=dict,
            description="Extra keyword arguments for the attention processors.",
        ),
    ]

    def call_guider(self, components, block_state):
        """The call's copy of the guider, made again when a step callback changes the scale (the classic
        pipelines read ``do_classifier_free_guidance`` at every step)."""
        scale = guidance_scale(components, block_state.guidance_scale)
        if "call_guider" not in block_state or block_state.__dict__.get("call_guider_scale") != scale:
            block_state.call_guider_scale = scale
            guider = call_guider(components.guider, scale, guidance_on=do_classifier_free_guidance(scale))
            check_guider(guider, components.transformer, "transformer", type(self).__name__)
            block_state.call_guider = guider
        return block_state.call_guider

    def _forward(self, components, block_state, t, latents, embeds, pooled, **extra) -> torch.Tensor:
        return components.transformer(
            hidden_states=latents,
            timestep=t.expand(latents.shape[0]),
            encoder_hidden_states=embeds,
            pooled_projections=pooled,
            joint_attention_kwargs=block_state.joint_attention_kwargs,
            return_dict=False,
            **extra,
        )[0]

    def __call__(self, components, block_state, i, t):
        if "skip_layer_embeds" not in block_state:
            # The skipped-layers pass reads the prompt's embeddings as the loop began, as the classic pipeline
            # does: a step callback that replaces prompt_embeds changes the guided passes only.
            block_state.skip_layer_embeds = (block_state.prompt_embeds, block_state.pooled_prompt_embeds)
        guider = self.call_guider(components, block_state)
        guider.set_state(step=i, num_inference_steps=len(block_state.timesteps), timestep=t)
        guided = do_classifier_free_guidance(guidance_scale(components, block_state.guidance_scale))
        # Without guidance the prompt stands in for the negative (PAG's perturbed pass reads that slot).
        negative = block_state.negative_prompt_embeds if guided else block_state.prompt_embeds
        negative_pooled = (
            block_state.negative_pooled_prompt_embeds if guided else block_state.pooled_prompt_embeds
        )
        inputs = {
            "encoder_hidden_states": (block_state.prompt_embeds, negative),
            "pooled_projections": (block_state.pooled_prompt_embeds, negative_pooled),
        }

        def predict(conditions: list[dict[str, Any]]) -> list[torch.Tensor]:
            count = len(conditions)
            stacked = {name: stack_conditions([c[name] for c in conditions]) for name in inputs}
            latents = stack_conditions([block_state.latent_model_input] * count)
            noise_pred = self._forward(
                components,
                block_state,
                t,
                latents,
                stacked["encoder_hidden_states"],
                stacked["pooled_projections"],
            )
            return list(noise_pred.chunk(count))

        output = guided_prediction(guider, components.transformer, inputs, predict, unconditional_first=True)
        noise_pred = output.pred
        layers, steps = block_state.skip_guidance_layers, block_state.num_inference_steps
        in_window = (
            steps * block_state.skip_layer_guidance_start < i < steps * block_state.skip_layer_guidance_stop
        )
        if guided and layers is not None and in_window:
            skipped = self._forward(
                components,
                block_state,
                t,
                block_state.latent_model_input,
                *block_state.skip_layer_embeds,
                skip_layers=layers,
            )
            noise_pred = noise_pred + (output.pred_cond - skipped) * block_state.skip_layer_guidance_scale
        block_state.noise_pred = noise_pred
        return components, block_state


class StableDiffusion3LoopAfterDenoiser(SchedulerStepAfterDenoiser):
    """Loop step: the flow-matching Euler step from t to the next timestep."""

    model_name = MODEL_NAME
    expected_components = [SCHEDULER]


class StableDiffusion3InpaintLoopAfterDenoiser(StableDiffusion3LoopAfterDenoiser):
    """Loop step for inpainting: the Euler step, then, for a transformer that reads the latents alone, the area
    outside the mask pasted back from the image noised to the next timestep."""

    description = (
        "Inside the loop: the scheduler step; unless the transformer reads the mask channels, the area outside the "
        "mask is then replaced by image_latents noised to the next timestep (scale_noise with the initial noise)."
    )

    expected_components = [SCHEDULER, TRANSFORMER]

    inputs = [
        _MASK,
        InputParam("image_latents", type_hint=torch.Tensor, description="VAE latents of the image."),
        InputParam("noise", type_hint=torch.Tensor, description="The noise the latents started from."),
    ]

    def __call__(self, components, block_state, i, t):
        components, block_state = super().__call__(components, block_state, i, t)
        if reads_mask_channels(components):
            return components, block_state
        kept = block_state.image_latents
        timesteps = block_state.timesteps
        if i < len(timesteps) - 1:
            kept = components.scheduler.scale_noise(kept, torch.tensor([timesteps[i + 1]]), block_state.noise)
        mask = block_state.mask
        block_state.latents = (1 - mask) * kept + mask * block_state.latents
        return components, block_state


# Tensors the classic loop never reads after joining them into its classifier-free batch: what a callback
# returns for them is kept and shown to later callbacks, and changes nothing (blocks/common keeps
# negative_prompt_embeds the same way).
_KEPT_HERE = ("negative_pooled_prompt_embeds",)


class StableDiffusion3DenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop with its own denoiser and scheduler.

    A step callback gets the tensors of the classic pipelines, as they hold them: ``prompt_embeds`` and
    ``pooled_prompt_embeds`` are the classifier-free batches ``cat([negative, positive])`` while guidance is on
    (the positive rows once a callback turns it off); ``negative_prompt_embeds`` and
    ``negative_pooled_prompt_embeds`` the negative rows, which the classic loops never read again.
    """

    model_name = MODEL_NAME

    _callback_tensor_inputs: tuple[str, ...] = (
        "latents",
        "prompt_embeds",
        "pooled_prompt_embeds",
        "negative_prompt_embeds",
        "negative_pooled_prompt_embeds",
    )

    guidance_batches: tuple[GuidanceBatch, ...] = (
        GuidanceBatch("prompt_embeds", "prompt_embeds", "negative_prompt_embeds"),
        GuidanceBatch("pooled_prompt_embeds", "pooled_prompt_embeds", "negative_pooled_prompt_embeds"),
    )

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, TRANSFORMER]

    # Previews of SD3's 16-channel latents; an inpainting transformer's mask channels are built per step.
    latent_rgb_map = SD3_LATENT_RGB

    def guided(self, components, block_state) -> bool:
        """Whether classifier-free guidance is on for the call's next step (a callback may have turned it off)."""
        return do_classifier_free_guidance(guidance_scale(components, block_state.guidance_scale))

    def callback_values(self, components, block_state, names):
        kept = block_state.__dict__.setdefault("callback_kept", {})
        values = block_state.__dict__
        names = list(names)
        given = present(
            values,
            [n for n in names if n not in _KEPT_HERE],
            self.guidance_batches,
            self.guided(components, block_state),
            kept,
            type(self).__name__,
        )
        for name in names:
            if name in _KEPT_HERE:
                given[name] = kept.setdefault(name, values.get(name))
        return {name: given[name] for name in names}

    def take_callback_values(self, components, block_state, updates):
        kept = block_state.__dict__.setdefault("callback_kept", {})
        rest = {}
        for name, value in updates.items():
            if name in _KEPT_HERE:
                kept[name] = value
            else:
                rest[name] = value
        changes = take(block_state.__dict__, rest, self.guidance_batches, kept, type(self).__name__)
        super().take_callback_values(components, block_state, changes)


class StableDiffusion3DenoiseStep(StableDiffusion3DenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [
        StableDiffusion3LoopBeforeDenoiser,
        StableDiffusion3LoopDenoiser,
        StableDiffusion3LoopAfterDenoiser,
    ]

    description = (
        "Denoises the latents over the timesteps. Each step runs: before_denoiser (transformer input), "
        "denoiser (transformer, guidance, skip-layer guidance), after_denoiser (Euler step)."
    )


class StableDiffusion3InpaintDenoiseStep(StableDiffusion3DenoiseLoopWrapper):
    """The inpainting denoising loop, for transformers that read the latents alone or with the mask channels."""

    block_classes = [
        StableDiffusion3InpaintLoopBeforeDenoiser,
        StableDiffusion3LoopDenoiser,
        StableDiffusion3InpaintLoopAfterDenoiser,
    ]

    description = (
        "Denoises the latents for inpainting. An inpainting transformer (33 input channels) sees the mask and "
        "the masked image each step; with one that reads the latents alone the area outside the mask is pasted "
        "back after each step."
    )
