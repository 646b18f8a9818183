"""The denoising loop: per step, the transformer's velocity per condition the guider asks for, combined by the
guider and rescaled to the positive prediction's norm, then the flow-matching Euler step."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from blocks.common import SchedulerStepAfterDenoiser, TimestepLoopBlocks
from blocks.common.guidance import GuiderKindCheck, call_guider, check_guider, guided_prediction
from blocks.common.latent_preview import QWEN_IMAGE_LATENT_RGB, check_latent_channels
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    GUIDANCE_SCALE_INPUT,
    GUIDER_SPEC,
    MODEL_NAME,
    SCHEDULER,
    TRANSFORMER,
    embeds_input,
    guidance_on,
    mask_input,
    true_cfg_scale,
    true_cfg_scale_input,
    unpack_latents,
)

__all__ = [
    "QwenImageLoopBeforeDenoiser",
    "QwenImageEditLoopBeforeDenoiser",
    "QwenImageLoopDenoiser",
    "QwenImageLoopAfterDenoiser",
    "QwenImageInpaintLoopAfterDenoiser",
    "QwenImageInpaintDenoiseStep",
    "QwenImageDenoiseLoopWrapper",
    "QwenImageDenoiseStep",
    "QwenImageEditDenoiseStep",
    "norm_rescaled",
]

_LATENTS = InputParam("latents", type_hint=torch.Tensor, required=True, description="The packed latents.")


class QwenImageLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: the transformer reads the packed latents as they are, at t for every image."""

    model_name = MODEL_NAME

    description = "Inside the loop: latent_model_input = latents; the timestep t for every image."

    inputs = [_LATENTS]

    def model_input(self, block_state: Any) -> torch.Tensor:
        return block_state.latents

    def __call__(self, components, block_state, i, t):
        block_state.latent_model_input = self.model_input(block_state)
        block_state.timestep = t.expand(block_state.latents.shape[0]).to(block_state.latents.dtype)
        return components, block_state


class QwenImageEditLoopBeforeDenoiser(QwenImageLoopBeforeDenoiser):
    """Loop step for edit: the input image's latent tokens follow the latents' in every sample."""

    description = "Inside the loop: latent_model_input = cat([latents, image_latents], dim=1) (tokens)."

    inputs = [
        _LATENTS,
        InputParam(
            "image_latents",
            type_hint=torch.Tensor,
            required=True,
            description="The input image's packed, normalized latents, one per image of the batch.",
        ),
    ]

    def model_input(self, block_state):
        return torch.cat([block_state.latents, block_state.image_latents], dim=1)


def norm_rescaled(pred: torch.Tensor, pred_cond: torch.Tensor) -> torch.Tensor:
    """The guided prediction rescaled, per token, to the norm of the positive prediction (the classic rule)."""
    cond_norm = torch.norm(pred_cond, dim=-1, keepdim=True)
    norm = torch.norm(pred, dim=-1, keepdim=True)
    return pred * (cond_norm / norm)


class QwenImageLoopDenoiser(GuiderKindCheck, ModularPipelineBlocks):
    """Loop step: the transformer's prediction per condition the guider asks for, combined by the guider."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: asks the guider (default ClassifierFreeGuidance, scale 4) which conditions to predict "
        "at t; runs the transformer once per condition (its embeddings and mask, at t / 1000, with img_shapes), "
        "keeping the predictions of the latents' tokens; combines them with the guider: pred = neg + scale * "
        "(pos - neg) by default, on with true_cfg_scale > 1 and negative embeddings. When the guider combined "
        "more than one prediction, the result is rescaled per token to the positive prediction's norm "
        "(norm_rescale, on by default as in the classic pipelines)."
    )

    expected_components = [GUIDER_SPEC, TRANSFORMER]

    inputs = [
        embeds_input("prompt_embeds", required=True),
        mask_input("prompt_embeds_mask"),
        embeds_input("negative_prompt_embeds"),
        mask_input("negative_prompt_embeds_mask"),
        true_cfg_scale_input(),
        GUIDANCE_SCALE_INPUT,
        InputParam(
            "norm_rescale",
            type_hint=bool,
            default=True,
            description="Rescale the guided prediction per token to the positive prediction's norm.",
        ),
        InputParam("img_shapes", type_hint=list, required=True, description="The image token shapes (RoPE)."),
        InputParam(
            "attention_kwargs", type_hint=dict, description="Extra kwargs for the attention processors."
        ),
    ]

    def call_guider(self, components: Any, block_state: Any) -> Any:
        """The call's copy of the guider (made at the first step and checked against the transformer)."""
        if "call_guider" not in block_state:
            scale = true_cfg_scale(components, block_state.true_cfg_scale)
            guided = guidance_on(scale, block_state.negative_prompt_embeds is not None)
            guider = call_guider(components.guider, scale, guidance_on=guided)
            check_guider(guider, components.transformer, "transformer", type(self).__name__)
            block_state.call_guider = guider
        return block_state.call_guider

    def __call__(self, components, block_state, i, t):
        transformer = components.transformer
        guider = self.call_guider(components, block_state)
        guider.set_state(step=i, num_inference_steps=len(block_state.timesteps), timestep=t)
        guidance = None
        if transformer.config.guidance_embeds:
            guidance = torch.full(
                [1], block_state.guidance_scale, device=block_state.latents.device, dtype=torch.float32
            ).expand(block_state.latents.shape[0])
        inputs = {
            "encoder_hidden_states": (block_state.prompt_embeds, block_state.negative_prompt_embeds),
            "encoder_hidden_states_mask": (
                block_state.prompt_embeds_mask,
                block_state.negative_prompt_embeds_mask,
            ),
        }
        tokens = block_state.latents.size(1)

        def predict(conditions: list[dict[str, Any]]) -> list[torch.Tensor]:
            # One transformer call per condition, as the classic pipelines run them (the conditions' text
            # lengths differ, and one call per batch keeps the results bit for bit theirs).
            predictions = []
            for k, condition in enumerate(conditions):
                context = ("cond", "uncond")[k] if len(conditions) == 2 else f"condition_{k}"
                cache = transformer.cache_context(context) if hasattr(transformer, "cache_context") else None
                with cache or contextlib.nullcontext():
                    out = transformer(
                        hidden_states=block_state.latent_model_input,
                        timestep=block_state.timestep / 1000,
                        guidance=guidance,
                        encoder_hidden_states_mask=condition["encoder_hidden_states_mask"],
                        encoder_hidden_states=condition["encoder_hidden_states"],
                        img_shapes=block_state.img_shapes,
                        attention_kwargs=block_state.attention_kwargs or {},
                        return_dict=False,
                    )[0]
                predictions.append(out[:, :tokens])
            return predictions

        output = guided_prediction(guider, transformer, inputs, predict, unconditional_first=False)
        pred = output.pred
        if guider.num_conditions > 1 and block_state.norm_rescale:
            pred = norm_rescaled(pred, output.pred_cond)
        block_state.noise_pred = pred
        return components, block_state


class QwenImageLoopAfterDenoiser(SchedulerStepAfterDenoiser):
    """Loop step: the flow-matching Euler step from t to the next sigma."""

    model_name = MODEL_NAME
    expected_components = [SCHEDULER]


class QwenImageInpaintLoopAfterDenoiser(QwenImageLoopAfterDenoiser):
    """Loop step for inpainting: the Euler step, then outside the mask the image latents noised to the next
    timestep (the clean ones at the last step)."""

    description = (
        "Inside the loop: latents = scheduler.step(noise_pred, t, latents); then latents = (1 - mask) * image + "
        "mask * latents, the image latents noised to the next timestep with the call's noise (clean at the last)."
    )

    inputs = [
        InputParam(
            "mask", type_hint=torch.Tensor, required=True, description="The packed mask (1: repaint)."
        ),
        InputParam(
            "image_latents", type_hint=torch.Tensor, required=True, description="The packed image latents."
        ),
        InputParam("noise", type_hint=torch.Tensor, required=True, description="The packed noise."),
    ]

    def __call__(self, components, block_state, i, t):
        components, block_state = super().__call__(components, block_state, i, t)
        kept = block_state.image_latents
        timesteps = block_state.timesteps
        if i < len(timesteps) - 1:
            kept = components.scheduler.scale_noise(kept, torch.tensor([timesteps[i + 1]]), block_state.noise)
        mask = block_state.mask
        block_state.latents = (1 - mask) * kept + mask * block_state.latents
        return components, block_state


class QwenImageDenoiseLoopWrapper(TimestepLoopBlocks):
    """The family's denoising loop: the shared timestep loop with its own denoiser and scheduler."""

    model_name = MODEL_NAME

    # The classic Qwen-Image pipelines' callback tensors, in their layout: packed latents [B, tokens, C * 4] and
    # prompt_embeds [B, seq_len, dim], per image (repeated for num_images_per_prompt).
    _callback_tensor_inputs = ("latents", "prompt_embeds")

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, TRANSFORMER]

    @property
    def loop_inputs(self) -> list[InputParam]:
        return [
            *super().loop_inputs,
            InputParam.template("height"),
            InputParam.template("width"),
        ]

    @property
    def loop_intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam("latents", type_hint=torch.Tensor, description="The denoised packed latents.")]

    latent_rgb_map = QWEN_IMAGE_LATENT_RGB  # Wan 2.1's latent space, on the unpacked normalized latents

    def check_previews(self, components: Any, decoder: Any = None) -> None:
        """Before the run: the map or ``decoder`` reads latents of the loaded VAE's channels (its ``z_dim``).

        Raises:
            PreviewUnavailableError: they do not (the tiny test VAE has 4, Wan 2.1's map takes 16).
        """
        vae = getattr(components, "vae", None)
        if vae is None:
            return
        if decoder is not None:
            wanted, reader = getattr(decoder.config, "latent_channels", None), type(decoder).__name__
        else:
            wanted, reader = self.latent_rgb_map.channels, f"the {self.latent_rgb_map.name} latent-to-RGB map"
        check_latent_channels(int(vae.config.z_dim), wanted, reader)

    def preview_latents(self, components, block_state) -> torch.Tensor:
        """The packed latents unpacked to the VAE's [B, C, H, W] (its one frame dropped)."""
        return unpack_latents(components, block_state.latents, block_state.height, block_state.width)[:, :, 0]


class QwenImageDenoiseStep(QwenImageDenoiseLoopWrapper):
    """The text-to-image denoising loop."""

    block_classes = [QwenImageLoopBeforeDenoiser, QwenImageLoopDenoiser, QwenImageLoopAfterDenoiser]

    description = (
        "Denoises the packed latents over the timesteps. Each step runs: before_denoiser (transformer input), "
        "denoiser (transformer per condition, guider, norm rescale), after_denoiser (Euler step)."
    )


class QwenImageInpaintDenoiseStep(QwenImageDenoiseLoopWrapper):
    """The inpainting denoising loop: the text-to-image step, then the blend outside the mask."""

    block_classes = [QwenImageLoopBeforeDenoiser, QwenImageLoopDenoiser, QwenImageInpaintLoopAfterDenoiser]

    description = (
        "Denoises the packed latents over the timesteps. Each step runs: before_denoiser (transformer input), "
        "denoiser (transformer per condition, guider, norm rescale), after_denoiser (Euler step, then the image "
        "latents kept outside the mask)."
    )


class QwenImageEditDenoiseStep(QwenImageDenoiseLoopWrapper):
    """The edit denoising loop: the input image's latent tokens ride beside the latents at every step."""

    block_classes = [QwenImageEditLoopBeforeDenoiser, QwenImageLoopDenoiser, QwenImageLoopAfterDenoiser]

    description = (
        "Denoises the packed latents with the input image's latent tokens beside them. Each step runs: "
        "before_denoiser (latents and image_latents concatenated), denoiser (transformer per condition, guider, "
        "norm rescale; the image's tokens dropped from the prediction), after_denoiser (Euler step)."
    )
