"""Flux.2 Klein's denoiser: true classifier-free guidance through the guider, one transformer pass per
condition (the classic pipeline's order: conditional, then unconditional), no embedded guidance."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from blocks.common.guidance import (
    GuiderKindCheck,
    call_guider,
    check_guider,
    guided_prediction,
    guider_spec,
    neutral_scale,
)
from modular import InputParam, ModularPipelineBlocks

from .denoise import Flux2DenoiseLoopWrapper, Flux2LoopAfterDenoiser, Flux2LoopBeforeDenoiser
from .klein_encoders import IS_DISTILLED, KLEIN_GUIDANCE_SCALE, klein_guidance_scale_input, klein_guided
from .utils import MODEL_NAME, TRANSFORMER

__all__ = ["KLEIN_GUIDER_SPEC", "Flux2KleinLoopDenoiser", "Flux2KleinDenoiseStep"]

# The classic pipeline's guidance, neg + scale * (pos - neg): classifier-free guidance as diffusers' guider
# computes it by default.
KLEIN_GUIDER_SPEC = guider_spec(guidance_scale=KLEIN_GUIDANCE_SCALE)


class Flux2KleinLoopDenoiser(GuiderKindCheck, ModularPipelineBlocks):
    """Loop step: the transformer's flow per condition the guider asks for, combined by the guider."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: asks the guider (default ClassifierFreeGuidance) which conditions to predict at t and "
        "runs the transformer once per condition (the prompt's embeddings, then the negative's), each keeping "
        "the latent tokens' prediction; the guider combines them: neg + scale * (pos - neg). Guidance runs for "
        "guidance_scale > 1 when the pipeline is not distilled; otherwise one pass per step."
    )

    expected_components = [KLEIN_GUIDER_SPEC, TRANSFORMER]

    expected_configs = [IS_DISTILLED]

    inputs = [
        InputParam("latents", type_hint=torch.Tensor, required=True, description="The packed latents."),
        InputParam.template("prompt_embeds", required=True),
        InputParam("text_ids", type_hint=torch.Tensor, required=True, description="Text position ids."),
        InputParam.template("negative_prompt_embeds"),
        InputParam("negative_text_ids", type_hint=torch.Tensor, description="Negative text position ids."),
        klein_guidance_scale_input(),
        InputParam(
            "joint_attention_kwargs",
            type_hint=dict,
            description="Extra keyword arguments for the attention processors (the classic attention_kwargs).",
        ),
    ]

    def call_guider(self, components: Any, block_state: Any) -> Any:
        """The call's copy of the guider (made at the first step and checked against the transformer)."""
        if "call_guider" not in block_state:
            scale, guided = klein_guided(components, block_state.guidance_scale)
            guider = call_guider(components.guider, scale, guidance_on=guided)
            check_guider(guider, components.transformer, "transformer", type(self).__name__)
            block_state.call_guider = guider
        return block_state.call_guider

    def __call__(self, components, block_state, i, t):
        scale, guided = klein_guided(components, block_state.guidance_scale)
        if guided and block_state.negative_prompt_embeds is None:
            # Only a step callback can turn guidance on mid-call; the call itself encoded no negative prompt.
            msg = (
                f"{type(self).__name__}: a step callback set pipeline._guidance_scale to {scale} (> 1) in a call "
                "that began without guidance, so there are no negative embeddings to guide with; start the call "
                "with guidance_scale > 1, or leave the scale at 1 or below"
            )
            raise ValueError(msg)
        guider = self.call_guider(components, block_state)
        guider.guidance_scale = scale if guided else neutral_scale(guider)
        guider.set_state(step=i, num_inference_steps=len(block_state.timesteps), timestep=t)
        negative = (block_state.negative_prompt_embeds, block_state.negative_text_ids) if guided else None
        # Without guidance the prompt stands in for the negative (a perturbing guider's pass reads that slot).
        negative = negative or (block_state.prompt_embeds, block_state.text_ids)
        inputs = {
            "encoder_hidden_states": (block_state.prompt_embeds, negative[0]),
            "txt_ids": (block_state.text_ids, negative[1]),
        }
        transformer, latents = components.transformer, block_state.latents
        timestep = t.expand(latents.shape[0]).to(latents.dtype) / 1000

        def predict(conditions: list[dict[str, Any]]) -> list[torch.Tensor]:
            predictions = []
            for condition in conditions:
                name = "cond" if condition["encoder_hidden_states"] is block_state.prompt_embeds else "uncond"
                cache = transformer.cache_context(name) if hasattr(transformer, "cache_context") else None
                with cache or contextlib.nullcontext():
                    out = transformer(
                        hidden_states=block_state.latent_model_input,
                        timestep=timestep,
                        guidance=None,
                        encoder_hidden_states=condition["encoder_hidden_states"],
                        txt_ids=condition["txt_ids"],
                        img_ids=block_state.img_ids,
                        joint_attention_kwargs=block_state.joint_attention_kwargs,
                        return_dict=False,
                    )[0]
                predictions.append(out[:, : latents.size(1) :])
            return predictions

        output = guided_prediction(guider, transformer, inputs, predict, unconditional_first=False)
        block_state.noise_pred = output.pred
        return components, block_state


class Flux2KleinDenoiseStep(Flux2DenoiseLoopWrapper):
    """Klein's text-to-image and image-conditioned denoising loop."""

    block_classes = [Flux2LoopBeforeDenoiser, Flux2KleinLoopDenoiser, Flux2LoopAfterDenoiser]

    description = (
        "Denoises the packed latents over the timesteps. Each step runs: before_denoiser (the latents and any "
        "reference tokens), denoiser (transformer per condition, the guider's combination), after_denoiser "
        "(scheduler step)."
    )
