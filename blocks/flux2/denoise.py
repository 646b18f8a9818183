"""The denoising loop: per step, put the reference tokens beside the latents, predict the flow, step."""

from __future__ import annotations

import contextlib

import torch

from blocks.common import SchedulerStepAfterDenoiser, TimestepLoopBlocks
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    MODEL_NAME,
    SCHEDULER,
    TRANSFORMER,
    denormalize_latents,
    unpack_latents_with_ids,
    unpatchify_latents,
)

__all__ = [
    "Flux2LoopBeforeDenoiser",
    "Flux2LoopDenoiser",
    "Flux2LoopAfterDenoiser",
    "Flux2DenoiseLoopWrapper",
    "Flux2DenoiseStep",
]

_LATENTS = InputParam("latents", type_hint=torch.Tensor, required=True, description="The packed latents.")


class Flux2LoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: the transformer's input tokens, the reference images' after the latents when editing."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: latent_model_input = latents, followed by image_latents (the reference images' tokens) "
        "when given, in the transformer's dtype; img_ids are their position ids in the same order."
    )

    expected_components = [TRANSFORMER]

    inputs = [
        _LATENTS,
        InputParam("latent_ids", type_hint=torch.Tensor, required=True, description="Latent position ids."),
        InputParam("image_latents", type_hint=torch.Tensor, description="Packed reference image latents."),
        InputParam("image_latent_ids", type_hint=torch.Tensor, description="Reference image position ids."),
    ]

    def __call__(self, components, block_state, i, t):
        dtype = components.transformer.dtype
        latents, ids = block_state.latents, block_state.latent_ids
        if block_state.image_latents is None:
            block_state.latent_model_input, block_state.img_ids = latents.to(dtype), ids
        else:
            block_state.latent_model_input = torch.cat([latents, block_state.image_latents], dim=1).to(dtype)
            block_state.img_ids = torch.cat([ids, block_state.image_latent_ids], dim=1)
        return components, block_state


class Flux2LoopDenoiser(ModularPipelineBlocks):
    """Loop step: predict the flow of the latent tokens with the transformer (embedded guidance, one pass)."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: runs the transformer on latent_model_input at t / 1000 with the embedded guidance, "
        "the prompt embeddings and the text and image position ids, and keeps the prediction of the latent "
        "tokens (the reference tokens' are dropped)."
    )

    expected_components = [TRANSFORMER]

    inputs = [
        _LATENTS,
        InputParam.template("prompt_embeds", required=True),
        InputParam("text_ids", type_hint=torch.Tensor, required=True, description="Text position ids."),
        InputParam("guidance", type_hint=torch.Tensor, description="The embedded guidance per image."),
        InputParam(
            "joint_attention_kwargs",
            type_hint=dict,
            description="Extra keyword arguments for the attention processors (the classic attention_kwargs).",
        ),
    ]

    def __call__(self, components, block_state, i, t):
        transformer, latents = components.transformer, block_state.latents
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        # cache_context names the branch for caching hooks (first-block cache...); a no-op without them.
        cache = transformer.cache_context("cond") if hasattr(transformer, "cache_context") else None
        with cache or contextlib.nullcontext():
            noise_pred = transformer(
                hidden_states=block_state.latent_model_input,
                timestep=timestep / 1000,
                guidance=block_state.guidance,
                encoder_hidden_states=block_state.prompt_embeds,
                txt_ids=block_state.text_ids,
                img_ids=block_state.img_ids,
                joint_attention_kwargs=block_state.joint_attention_kwargs,
                return_dict=False,
            )[0]
        block_state.noise_pred = noise_pred[:, : latents.size(1) :]
        return components, block_state


class Flux2LoopAfterDenoiser(SchedulerStepAfterDenoiser):
    """Loop step: the flow-matching Euler step from t to the next timestep."""

    model_name = MODEL_NAME
    expected_components = [SCHEDULER]


class Flux2DenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop with its own transformer and scheduler."""

    model_name = MODEL_NAME

    # The classic pipeline's callback tensors, in its layout: packed latents [B, tokens, C] and the prompt
    # embeddings [B, seq_len, layers * dim], both per image (repeated for num_images_per_prompt).
    _callback_tensor_inputs = ("latents", "prompt_embeds")

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, TRANSFORMER]

    @property
    def loop_intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam("latents", type_hint=torch.Tensor, description="The denoised packed latents.")]

    def preview_latents(self, components, block_state) -> torch.Tensor:
        """The packed latents as the VAE decodes them, [B, C, H, W]: unpacked by their position ids,
        denormalized by the VAE's batch norm and unpatchified."""
        latents = unpack_latents_with_ids(block_state.latents, block_state.latent_ids)
        vae = getattr(components, "vae", None)
        if vae is not None:
            latents = denormalize_latents(vae, latents)
        return unpatchify_latents(latents)


class Flux2DenoiseStep(Flux2DenoiseLoopWrapper):
    """The text-to-image and editing denoising loop."""

    block_classes = [Flux2LoopBeforeDenoiser, Flux2LoopDenoiser, Flux2LoopAfterDenoiser]

    description = (
        "Denoises the packed latents over the timesteps. Each step runs: before_denoiser (the latents and any "
        "reference tokens), denoiser (transformer, embedded guidance), after_denoiser (scheduler step)."
    )
