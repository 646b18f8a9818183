"""The denoising loop: per step, build the transformer input, predict the flow (true CFG optional), step."""

from __future__ import annotations

import contextlib

import torch

from blocks.common import SchedulerStepAfterDenoiser, TimestepLoopBlocks
from blocks.common.ip_adapter import IP_ADAPTER_DENOISER_INPUTS, denoiser_ip_embeds
from blocks.common.latent_preview import FLUX_LATENT_RGB
from modular import (
    ComponentSpec,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
)

from .utils import MODEL_NAME, SCHEDULER, unpack_latents

__all__ = [
    "FluxLoopBeforeDenoiser",
    "FluxControlLoopBeforeDenoiser",
    "FluxLoopDenoiser",
    "FluxLoopAfterDenoiser",
    "FluxDenoiseLoopWrapper",
    "FluxDenoiseStep",
    "FluxControlDenoiseStep",
]

_TRANSFORMER = ComponentSpec("transformer", "diffusers.FluxTransformer2DModel")
_LATENTS = InputParam("latents", type_hint=torch.Tensor, required=True, description="The packed latents.")


class FluxLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: the transformer reads the packed latents as they are."""

    model_name = MODEL_NAME

    description = "Inside the loop: latent_model_input = latents (Flux needs no input scaling)."

    inputs = [_LATENTS]

    def __call__(self, components, block_state, i, t):
        block_state.latent_model_input = block_state.latents
        return components, block_state


class FluxControlLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step for control: the control latents go beside the latents, along the channels."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: latent_model_input = cat([latents, control_latents], dim=2) (token channels)."
    )

    inputs = [
        _LATENTS,
        InputParam(
            "control_latents",
            type_hint=torch.Tensor,
            required=True,
            description="Packed VAE latents of the control image.",
        ),
    ]

    def __call__(self, components, block_state, i, t):
        block_state.latent_model_input = torch.cat([block_state.latents, block_state.control_latents], dim=2)
        return components, block_state


class FluxLoopDenoiser(ModularPipelineBlocks):
    """Loop step: predict the flow with the transformer; with true CFG, also for the negative prompt."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: runs the transformer on latent_model_input at t / 1000 with the T5 and pooled CLIP "
        "embeddings, the text and image position ids and the embedded guidance. With true_cfg_scale > 1 and "
        "negative embeddings: noise_pred = negative + true_cfg_scale * (positive - negative)."
    )

    expected_components = [_TRANSFORMER]

    @property
    def inputs(self) -> list[InputParam]:
        tensor = torch.Tensor
        return [
            InputParam.template("prompt_embeds", required=True),
            InputParam("pooled_prompt_embeds", type_hint=tensor, required=True, description="Pooled CLIP."),
            InputParam("text_ids", type_hint=tensor, required=True, description="Text position ids."),
            InputParam(
                "latent_image_ids", type_hint=tensor, required=True, description="Image position ids."
            ),
            InputParam("guidance", type_hint=tensor, description="The embedded guidance per image, or None."),
            InputParam.template("negative_prompt_embeds"),
            InputParam(
                "negative_pooled_prompt_embeds", type_hint=tensor, description="Pooled CLIP, negative."
            ),
            InputParam("true_cfg_scale", type_hint=float, default=1.0, description="True CFG scale."),
            InputParam(
                "joint_attention_kwargs",
                type_hint=dict,
                description="Extra keyword arguments for the attention processors.",
            ),
            *IP_ADAPTER_DENOISER_INPUTS,
        ]

    @staticmethod
    def _predict(components, block_state, t, embeds, pooled, context: str, ip_embeds=None) -> torch.Tensor:
        transformer = components.transformer
        latents = block_state.latent_model_input
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        attention_kwargs = block_state.joint_attention_kwargs or {}
        if ip_embeds is not None:
            # The transformer pops the image prompt from the dict it is given: a fresh dict per prediction.
            attention_kwargs = {**attention_kwargs, "ip_adapter_image_embeds": ip_embeds}
        # cache_context names the branch for caching hooks (first-block cache...); a no-op without them.
        cache = transformer.cache_context(context) if hasattr(transformer, "cache_context") else None
        with cache or contextlib.nullcontext():
            return transformer(
                hidden_states=latents,
                timestep=timestep / 1000,
                guidance=block_state.guidance,
                pooled_projections=pooled,
                encoder_hidden_states=embeds,
                txt_ids=block_state.text_ids,
                img_ids=block_state.latent_image_ids,
                joint_attention_kwargs=attention_kwargs,
                return_dict=False,
            )[0]

    def __call__(self, components, block_state, i, t):
        name = type(self).__name__
        ip_embeds = denoiser_ip_embeds(components, block_state, "transformer", name)
        noise_pred = self._predict(
            components,
            block_state,
            t,
            block_state.prompt_embeds,
            block_state.pooled_prompt_embeds,
            "cond",
            ip_embeds,
        )
        if block_state.true_cfg_scale > 1 and block_state.negative_prompt_embeds is not None:
            negative_ip_embeds = (
                None
                if ip_embeds is None
                else denoiser_ip_embeds(components, block_state, "transformer", name, negative=True)
            )
            negative = self._predict(
                components,
                block_state,
                t,
                block_state.negative_prompt_embeds,
                block_state.negative_pooled_prompt_embeds,
                "uncond",
                negative_ip_embeds,
            )
            noise_pred = negative + block_state.true_cfg_scale * (noise_pred - negative)
        block_state.noise_pred = noise_pred
        return components, block_state


class FluxLoopAfterDenoiser(SchedulerStepAfterDenoiser):
    """Loop step: the flow-matching Euler step from t to the next timestep."""

    model_name = MODEL_NAME
    expected_components = [SCHEDULER]


class FluxDenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop with its own denoiser and scheduler."""

    # The classic Flux pipelines' callback tensors, in their layout: packed latents [B, seq, C * 4] and the T5
    # embeddings [B, seq, dim], both per image (repeated for num_images_per_prompt).
    _callback_tensor_inputs = ("latents", "prompt_embeds")

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, _TRANSFORMER]

    @property
    def loop_intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam("latents", type_hint=torch.Tensor, description="The denoised packed latents.")]

    latent_rgb_map = FLUX_LATENT_RGB

    def preview_latents(self, components, block_state) -> torch.Tensor:
        """The packed latents [B, tokens, C * 4] unpacked to [B, C, H, W]: the position ids of the tokens,
        (0, row, column) per 2x2 patch, give the latent height and width."""
        ids = block_state.latent_image_ids
        height, width = (int(ids[:, axis].max()) * 2 + 2 for axis in (1, 2))
        return unpack_latents(block_state.latents, height, width)


class FluxDenoiseStep(FluxDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [FluxLoopBeforeDenoiser, FluxLoopDenoiser, FluxLoopAfterDenoiser]

    description = (
        "Denoises the packed latents over the timesteps. Each step runs: before_denoiser (transformer "
        "input), denoiser (transformer, true CFG), after_denoiser (scheduler step)."
    )


class FluxControlDenoiseStep(FluxDenoiseLoopWrapper):
    """The control denoising loop: the control latents ride beside the latents at every step."""

    block_classes = [FluxControlLoopBeforeDenoiser, FluxLoopDenoiser, FluxLoopAfterDenoiser]

    description = (
        "Denoises the packed latents with a control transformer. Each step runs: before_denoiser (latents "
        "and control_latents concatenated), denoiser (transformer), after_denoiser (scheduler step)."
    )
