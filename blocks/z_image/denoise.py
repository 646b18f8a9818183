"""The denoising loop: per step, build the transformer's list inputs, predict with guidance, step the scheduler."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from blocks.common import TimestepLoopBlocks
from blocks.common.guidance import (
    GuiderKindCheck,
    call_guider,
    check_guider,
    guided_prediction,
    guider_spec,
    neutral_scale,
)
from blocks.common.latent_preview import Z_IMAGE_LATENT_RGB
from modular import (
    ComponentSpec,
    InputParam,
    ModularPipelineBlocks,
)

from .utils import (
    GUIDANCE_SCALE,
    MODEL_NAME,
    SCHEDULER,
    do_classifier_free_guidance,
    embeds_input,
    guidance_scale,
    guidance_scale_input,
)

__all__ = [
    "ZImageLoopBeforeDenoiser",
    "ZImageLoopDenoiser",
    "ZImageLoopAfterDenoiser",
    "ZImageDenoiseLoopWrapper",
    "ZImageDenoiseStep",
]

_TRANSFORMER = ComponentSpec("transformer", "diffusers.ZImageTransformer2DModel")
# The classic pipeline's guidance, pred = pos + scale * (pos - neg): classifier-free in its original
# formulation (diffusers' modular Z-Image declares the same class with the Imagen formulation, disabled).
GUIDER_SPEC = guider_spec(guidance_scale=GUIDANCE_SCALE, use_original_formulation=True)


class ZImageLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: the transformer's inputs for timestep t, and the guidance scale at this step."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: the model timestep (1000 - t) / 1000 per image and one [C, 1, H, W] latent per image "
        "(the denoiser repeats them per guidance condition). The step's guidance scale is guidance_scale, or 0 "
        "(guidance off at this step) once, with cfg_truncation <= 1, the model timestep exceeds cfg_truncation."
    )

    expected_components = [_TRANSFORMER]

    inputs = [
        InputParam(
            "latents", type_hint=torch.Tensor, required=True, description="The latents being denoised."
        ),
        guidance_scale_input(),
        InputParam(
            "cfg_truncation",
            type_hint=float,
            default=1.0,
            description="Guidance stops once the model timestep (0 at the start, 1 at the end) exceeds this.",
        ),
    ]

    def __call__(self, components, block_state, i, t):
        latents = block_state.latents
        timestep = (1000 - t.expand(latents.shape[0])) / 1000
        scale = guidance_scale(components, block_state.guidance_scale)
        truncation = block_state.cfg_truncation
        if (
            do_classifier_free_guidance(scale)
            and truncation is not None
            and float(truncation) <= 1
            and timestep[0].item() > truncation
        ):
            scale = 0.0
        block_state.step_guidance_scale = scale
        model_latents = latents.to(components.transformer.dtype)
        block_state.model_latents = list(model_latents.unsqueeze(2).unbind(dim=0))
        block_state.model_timestep = timestep
        return components, block_state


def _normalize(pred: torch.Tensor, pos: torch.Tensor, factor: float) -> torch.Tensor:
    """Shrink the guided prediction so its norm is at most `factor` times the positive prediction's."""
    max_norm = torch.linalg.vector_norm(pos) * factor
    norm = torch.linalg.vector_norm(pred)
    return pred * (max_norm / norm) if norm > max_norm else pred


class ZImageLoopDenoiser(GuiderKindCheck, ModularPipelineBlocks):
    """Loop step: the transformer's velocity per condition the guider asks for, combined by the guider."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: asks the guider (default ClassifierFreeGuidance in its original formulation) which "
        "conditions to predict at t, runs the transformer on the list inputs with each condition's embeddings "
        "(conditions that leave the model as it is share one batch, positives first), and combines the float32 "
        "predictions with the guider: pred = pos + scale * (pos - neg) by default. When the guider combined more "
        "than one prediction and cfg_normalization > 0, each image's prediction norm is capped at "
        "cfg_normalization x its positive prediction's. noise_pred is the negated prediction."
    )

    expected_components = [GUIDER_SPEC, _TRANSFORMER]

    inputs = [
        embeds_input("prompt_embeds", required=True),
        embeds_input("negative_prompt_embeds"),
        guidance_scale_input(),
        InputParam(
            "cfg_normalization",
            type_hint=bool | float,
            default=False,
            description="Cap the guided prediction's norm at this multiple of the positive's (False: off).",
        ),
        InputParam(
            "joint_attention_kwargs",
            type_hint=dict,
            description="Extra kwargs for the attention processors.",
        ),
    ]

    def call_guider(self, components, block_state):
        """The call's copy of the guider (made at the first step and checked against the transformer)."""
        if "call_guider" not in block_state:
            scale = guidance_scale(components, block_state.guidance_scale)
            guider = call_guider(components.guider, scale, guidance_on=do_classifier_free_guidance(scale))
            check_guider(guider, components.transformer, "transformer", type(self).__name__)
            block_state.call_guider = guider
        return block_state.call_guider

    def __call__(self, components, block_state, i, t):
        call_scale = guidance_scale(components, block_state.guidance_scale)
        guided = do_classifier_free_guidance(call_scale)
        if guided and block_state.negative_prompt_embeds is None:
            # Only a step callback can turn guidance on mid-call (the input step checks the call's own scale);
            # the classic pipeline fails inside the transformer then.
            msg = (
                f"{type(self).__name__}: a step callback set pipeline._guidance_scale to {call_scale} (> 0) in a "
                "call that began without guidance (guidance_scale 0), so there are no negative embeddings to "
                "guide with; start the call with guidance_scale > 0 (a callback may then set 0 to stop "
                "guidance), or leave the scale at 0"
            )
            raise ValueError(msg)
        guider = self.call_guider(components, block_state)
        # cfg_truncation turns classifier-free guidance off per step: the guider's neutral scale.
        scale = block_state.step_guidance_scale
        guider.guidance_scale = scale if do_classifier_free_guidance(scale) else neutral_scale(guider)
        guider.set_state(step=i, num_inference_steps=len(block_state.timesteps), timestep=t)
        # Without guidance the prompt stands in for the negative (PAG's perturbed pass reads that slot).
        negative = block_state.negative_prompt_embeds if guided else block_state.prompt_embeds
        inputs = {"cap_feats": (block_state.prompt_embeds, negative)}

        def predict(conditions: list[dict[str, Any]]) -> list[torch.Tensor]:
            count = len(conditions)
            outputs = components.transformer(
                block_state.model_latents * count,
                block_state.model_timestep.repeat(count),
                [embeds for condition in conditions for embeds in condition["cap_feats"]],
                joint_attention_kwargs=block_state.joint_attention_kwargs,
                return_dict=False,
            )[0]
            size = len(outputs) // count
            return [
                torch.stack([out.float() for out in outputs[k * size : (k + 1) * size]]) for k in range(count)
            ]

        output = guided_prediction(guider, components.transformer, inputs, predict, unconditional_first=False)
        pred, factor = output.pred, block_state.cfg_normalization
        if guider.num_conditions > 1 and factor and float(factor) > 0.0:
            pred = torch.stack(
                [_normalize(p, c, float(factor)) for p, c in zip(pred, output.pred_cond, strict=True)]
            )
        # The transformer predicts the velocity towards the image; the scheduler steps along its negative.
        block_state.noise_pred = -pred.squeeze(2)
        return components, block_state


class ZImageLoopAfterDenoiser(ModularPipelineBlocks):
    """Loop step: the flow-matching Euler step from t to the next sigma."""

    model_name = MODEL_NAME

    description = "Inside the loop: latents = scheduler.step(noise_pred, t, latents), in float32."

    expected_components = [SCHEDULER]

    def __call__(self, components, block_state, i, t):
        block_state.latents = components.scheduler.step(
            block_state.noise_pred.to(torch.float32), t, block_state.latents, return_dict=False
        )[0]
        return components, block_state


class ZImageDenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop with its own denoiser and scheduler."""

    model_name = MODEL_NAME

    # The classic Z-Image pipelines' callback tensors, in their layout: latents [B, C, H, W] and prompt_embeds
    # as a list of [seq_len, dim] tensors, one per image (repeated for num_images_per_prompt).
    _callback_tensor_inputs = ("latents", "prompt_embeds")

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, _TRANSFORMER]

    latent_rgb_map = Z_IMAGE_LATENT_RGB  # FLUX.1's VAE; the latents [B, 16, H, W] are not packed

    def take_callback_values(self, components: Any, block_state: Any, updates: Mapping[str, Any]) -> None:
        """Takes a step callback's replacements, once ``prompt_embeds`` is checked to be what the transformer
        reads: a list of one 2-D tensor per image (a callback written for the SD layout returns one tensor).

        Raises:
            TypeError: ``prompt_embeds`` is not a list of 2-D tensors; nothing is replaced.
            ValueError: it has another number of tensors than images; nothing is replaced.
        """
        if "prompt_embeds" in updates:
            embeds, images = updates["prompt_embeds"], len(block_state.prompt_embeds)
            if not isinstance(embeds, list) or not all(
                isinstance(e, torch.Tensor) and e.dim() == 2 for e in embeds
            ):
                msg = (
                    f"{type(self).__name__}: callback_on_step_end returned prompt_embeds as {_layout(embeds)}; "
                    f"Z-Image takes a list of one [seq_len, dim] tensor per image, as the callback was given it"
                )
                raise TypeError(msg)
            if len(embeds) != images:
                msg = (
                    f"{type(self).__name__}: callback_on_step_end returned {len(embeds)} prompt_embeds for "
                    f"{images} images; return one [seq_len, dim] tensor per image, as the callback was given them"
                )
                raise ValueError(msg)
        super().take_callback_values(components, block_state, updates)


def _layout(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, list):
        kinds = [list(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__ for e in value]
        return f"a list of {kinds}"
    return f"a {type(value).__name__}"


class ZImageDenoiseStep(ZImageDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [ZImageLoopBeforeDenoiser, ZImageLoopDenoiser, ZImageLoopAfterDenoiser]

    description = (
        "Denoises the latents over the timesteps. Each step runs: before_denoiser (model timestep, "
        "guidance doubling, list inputs), denoiser (transformer and guidance), after_denoiser (Euler step)."
    )
