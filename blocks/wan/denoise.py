"""The denoising loop: per step, pick the expert for t (Wan 2.2), predict with guidance, step the scheduler."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common import SchedulerStepAfterDenoiser, TimestepLoopBlocks
from blocks.common.guidance import (
    GuiderKindCheck,
    call_guider,
    check_guider,
    guided_prediction,
    guider_spec,
    neutral_scale,
)
from modular import ComponentSpec, InputParam, ModularPipelineBlocks

from .inputs import IMAGE_EMBEDS
from .utils import (
    BOUNDARY_RATIO,
    EXPAND_TIMESTEPS,
    GUIDANCE_SCALE,
    MODEL_NAME,
    SCHEDULER,
    TRANSFORMER,
    TRANSFORMER_2,
    denoiser,
    do_classifier_free_guidance,
    guidance_scale,
    guidance_scale_input,
)

__all__ = [
    "GUIDANCE_SCALE_2",
    "GUIDER_SPEC",
    "WanDenoiseLoopWrapper",
    "WanDenoiseStep",
    "WanImage2VideoDenoiseStep",
    "WanImage2VideoLoopBeforeDenoiser",
    "WanImage2VideoLoopDenoiser",
    "WanLoopAfterDenoiser",
    "WanLoopBeforeDenoiser",
    "WanLoopDenoiser",
    "expert_for",
]

# The classic pipelines' guidance, pred = neg + scale * (pos - neg), with their default scale.
GUIDER_SPEC = guider_spec(guidance_scale=GUIDANCE_SCALE)

GUIDANCE_SCALE_2 = InputParam(
    "guidance_scale_2",
    type_hint=float,
    description=(
        "Wan 2.2: the guidance scale of the low-noise expert (transformer_2); default: guidance_scale. Only for "
        "repos with a boundary_ratio."
    ),
)


def expert_for(components: Any, t: torch.Tensor) -> str:
    """The model that denoises at `t`: ``transformer`` at or above the boundary (boundary_ratio x the scheduler's
    num_train_timesteps) or without one, ``transformer_2`` below it."""
    ratio = getattr(components, "boundary_ratio", None)
    if ratio is None or t >= ratio * components.scheduler.config.num_train_timesteps:
        return "transformer"
    return "transformer_2"


class WanLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: which expert denoises at t, its guidance scale, and its inputs (latents, timestep)."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: picks the expert for t (transformer, or with the repo's boundary_ratio transformer_2 "
        "below boundary_ratio x num_train_timesteps) and its guidance scale (guidance_scale, guidance_scale_2 for "
        "transformer_2), casts the latents to the transformer's dtype and expands t to the batch (to every latent "
        "patch with expand_timesteps)."
    )

    expected_configs = [BOUNDARY_RATIO, EXPAND_TIMESTEPS]

    inputs = [
        InputParam(
            "latents", type_hint=torch.Tensor, required=True, description="The latents being denoised."
        ),
        guidance_scale_input(),
        GUIDANCE_SCALE_2,
    ]

    def model_input(self, components, block_state, t, dtype):
        """The transformer's hidden states and timestep at `t`."""
        latents = block_state.latents
        if getattr(components, "expand_timesteps", False):
            mask = torch.ones(latents.shape, dtype=torch.float32, device=latents.device)
            timestep = (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0).expand(latents.shape[0], -1)
        else:
            timestep = t.expand(latents.shape[0])
        return latents.to(dtype), timestep

    def __call__(self, components, block_state, i, t):
        expert = expert_for(components, t)
        scale = guidance_scale(components, block_state.guidance_scale)
        if expert == "transformer_2" and block_state.guidance_scale_2 is not None:
            scale = block_state.guidance_scale_2
        block_state.expert, block_state.expert_guidance_scale = expert, scale
        block_state.model_input, block_state.model_timestep = self.model_input(
            components, block_state, t, denoiser(components).dtype
        )
        return components, block_state


class WanImage2VideoLoopBeforeDenoiser(WanLoopBeforeDenoiser):
    """Loop step for image-to-video: the latents beside the image condition (or in it, with expand_timesteps)."""

    description = (
        WanLoopBeforeDenoiser.description
        + " Image-to-video: the latents are concatenated with image_condition_latents along the channels; with "
        "expand_timesteps the first latent frame is the image's latents, and its timestep 0."
    )

    inputs = [
        *WanLoopBeforeDenoiser.inputs,
        InputParam(
            "image_condition_latents",
            type_hint=torch.Tensor,
            required=True,
            description="The condition the transformer reads beside the latents.",
        ),
        InputParam(
            "first_frame_mask", type_hint=torch.Tensor, description="expand_timesteps: 0 on the first frame."
        ),
    ]

    def model_input(self, components, block_state, t, dtype):
        latents, condition = block_state.latents, block_state.image_condition_latents
        mask = block_state.first_frame_mask
        if mask is None:
            return torch.cat([latents, condition], dim=1).to(dtype), t.expand(latents.shape[0])
        model_input = ((1 - mask) * condition + mask * latents).to(dtype)
        timestep = (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0).expand(latents.shape[0], -1)
        return model_input, timestep


class WanLoopDenoiser(GuiderKindCheck, ModularPipelineBlocks):
    """Loop step: the expert's noise prediction per condition the guider asks for, combined by the guider."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: asks the guider (default ClassifierFreeGuidance at the expert's scale, on for "
        "guidance_scale > 1) which conditions to predict at t and runs the expert once per condition, the "
        "prompt's first (as the classic pipelines: no batching of conditions), then combines the predictions: "
        "pred = neg + scale * (pos - neg) by default."
    )

    expected_components = [GUIDER_SPEC, TRANSFORMER, TRANSFORMER_2]
    optional_components = ("transformer_2",)  # Wan 2.1 repos list it as [null, null]

    inputs = [
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
        guidance_scale_input(),
        InputParam(
            "attention_kwargs", type_hint=dict, description="Extra kwargs for the attention processors."
        ),
    ]

    def call_guider(self, components, block_state):
        """The call's copy of the guider (made at the first step and checked against the transformer)."""
        if "call_guider" not in block_state:
            scale = guidance_scale(components, block_state.guidance_scale)
            guider = call_guider(components.guider, scale, guidance_on=do_classifier_free_guidance(scale))
            check_guider(guider, denoiser(components), "transformer", type(self).__name__)
            block_state.call_guider = guider
        return block_state.call_guider

    def _expert(self, components, name: str):
        model = getattr(components, name, None)
        if model is None:
            msg = (
                f"{type(self).__name__}: the repo's boundary_ratio ({components.boundary_ratio}) hands the low-noise "
                f"timesteps to transformer_2, which this pipeline does not have; load transformer_2, or set "
                "boundary_ratio=None with pipe.update_components(boundary_ratio=None) to denoise with transformer alone"
            )
            raise ValueError(msg)
        return model

    def __call__(self, components, block_state, i, t):
        guided = do_classifier_free_guidance(guidance_scale(components, block_state.guidance_scale))
        if guided and block_state.negative_prompt_embeds is None:
            msg = (
                f"{type(self).__name__}: a step callback turned guidance on (pipeline._guidance_scale > 1) in a call "
                "that began without it, so there are no negative embeddings; start the call with guidance_scale > 1"
            )
            raise ValueError(msg)
        model = self._expert(components, block_state.expert)
        guider = self.call_guider(components, block_state)
        scale = block_state.expert_guidance_scale
        guider.guidance_scale = scale if guided else neutral_scale(guider)
        guider.set_state(step=i, num_inference_steps=len(block_state.timesteps), timestep=t)
        prompt_embeds = block_state.prompt_embeds
        negative = block_state.negative_prompt_embeds if guided else prompt_embeds
        inputs = {"encoder_hidden_states": (prompt_embeds, negative)}
        sigma = float(components.scheduler.sigmas[i])

        def predict(conditions: list[dict[str, Any]]) -> list[torch.Tensor]:
            predictions = []
            for condition in conditions:
                embeds = condition["encoder_hidden_states"]
                name = "cond" if embeds is prompt_embeds else "uncond"
                with model.cache_context(
                    name, step_index=i, sigma=sigma, num_inference_steps=len(block_state.timesteps)
                ):
                    predictions.append(
                        model(
                            hidden_states=block_state.model_input,
                            timestep=block_state.model_timestep,
                            encoder_hidden_states=embeds,
                            encoder_hidden_states_image=self.image_embeds(block_state),
                            attention_kwargs=block_state.attention_kwargs,
                            return_dict=False,
                        )[0]
                    )
            return predictions

        block_state.noise_pred = guided_prediction(
            guider, model, inputs, predict, unconditional_first=False
        ).pred
        return components, block_state

    def image_embeds(self, block_state) -> torch.Tensor | None:
        """What the transformer reads as encoder_hidden_states_image: nothing for text-to-video."""
        return None


class WanImage2VideoLoopDenoiser(WanLoopDenoiser):
    """Loop step for image-to-video: the same passes, with Wan 2.1's image embeddings."""

    inputs = [*WanLoopDenoiser.inputs, IMAGE_EMBEDS]

    def image_embeds(self, block_state) -> torch.Tensor | None:
        return block_state.image_embeds


class WanLoopAfterDenoiser(SchedulerStepAfterDenoiser):
    """Loop step: the scheduler's step from t."""

    model_name = MODEL_NAME
    expected_components = [SCHEDULER]


class WanDenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop over the scheduler and the experts."""

    model_name = MODEL_NAME

    # The classic Wan pipelines' callback tensors, in their layout ([B, seq_len, dim] embeddings).
    _callback_tensor_inputs = ("latents", "prompt_embeds", "negative_prompt_embeds")

    optional_components = ("transformer_2",)

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, TRANSFORMER, TRANSFORMER_2]


class WanDenoiseStep(WanDenoiseLoopWrapper):
    """The text-to-video denoising loop."""

    block_classes = [WanLoopBeforeDenoiser, WanLoopDenoiser, WanLoopAfterDenoiser]

    description = (
        "Denoises the latents over the timesteps. Each step runs: before_denoiser (the expert for t and its "
        "inputs), denoiser (the expert and guidance), after_denoiser (the scheduler's step)."
    )


class WanImage2VideoDenoiseStep(WanDenoiseLoopWrapper):
    """The image-to-video denoising loop."""

    block_classes = [WanImage2VideoLoopBeforeDenoiser, WanImage2VideoLoopDenoiser, WanLoopAfterDenoiser]

    description = (
        "Denoises the latents over the timesteps beside the image condition. Each step runs: before_denoiser "
        "(the expert for t, the latents with the condition), denoiser (the expert and guidance), after_denoiser "
        "(the scheduler's step)."
    )
