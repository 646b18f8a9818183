"""The denoising loop: per step, build the transformer's list inputs, predict with guidance, step the scheduler."""

from __future__ import annotations

import torch
from diffusers import ZImageTransformer2DModel

from blocks.common import TimestepLoopBlocks
from modular import (
    ComponentSpec,
    InputParam,
    ModularPipelineBlocks,
)

from .utils import MODEL_NAME, SCHEDULER, do_classifier_free_guidance, embeds_input, guidance_scale_input

__all__ = [
    "ZImageLoopBeforeDenoiser",
    "ZImageLoopDenoiser",
    "ZImageLoopAfterDenoiser",
    "ZImageDenoiseLoopWrapper",
    "ZImageDenoiseStep",
]

_TRANSFORMER = ComponentSpec("transformer", ZImageTransformer2DModel)


class ZImageLoopBeforeDenoiser(ModularPipelineBlocks):
    """Loop step: the transformer's inputs for timestep t, and whether guidance runs at this step."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: the model timestep (1000 - t) / 1000 per image; guidance runs at this step when "
        "guidance_scale > 0 and, with cfg_truncation <= 1, the model timestep is not above cfg_truncation. "
        "Makes the transformer's inputs: one [C, 1, H, W] latent per image (twice with guidance), the "
        "timesteps, and the embeddings list (positives, then negatives)."
    )

    expected_components = [_TRANSFORMER]

    inputs = [
        InputParam(
            "latents", type_hint=torch.Tensor, required=True, description="The latents being denoised."
        ),
        embeds_input("prompt_embeds", required=True),
        embeds_input("negative_prompt_embeds"),
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
        scale = block_state.guidance_scale
        guided = do_classifier_free_guidance(scale)
        truncation = block_state.cfg_truncation
        if guided and truncation is not None and float(truncation) <= 1 and timestep[0].item() > truncation:
            scale = 0.0
        block_state.step_guidance_scale = scale
        block_state.apply_cfg = guided and scale > 0
        model_latents = latents.to(components.transformer.dtype)
        embeds = block_state.prompt_embeds
        if block_state.apply_cfg:
            model_latents = model_latents.repeat(2, 1, 1, 1)
            embeds = embeds + block_state.negative_prompt_embeds
            timestep = timestep.repeat(2)
        block_state.model_latents = list(model_latents.unsqueeze(2).unbind(dim=0))
        block_state.model_timestep = timestep
        block_state.model_embeds = embeds
        return components, block_state


def _normalize(pred: torch.Tensor, pos: torch.Tensor, factor: float) -> torch.Tensor:
    """Shrink the guided prediction so its norm is at most `factor` times the positive prediction's."""
    max_norm = torch.linalg.vector_norm(pos) * factor
    norm = torch.linalg.vector_norm(pred)
    return pred * (max_norm / norm) if norm > max_norm else pred


class ZImageLoopDenoiser(ModularPipelineBlocks):
    """Loop step: the transformer's velocity, combined per image for guidance, as the scheduler's noise_pred."""

    model_name = MODEL_NAME

    description = (
        "Inside the loop: runs the transformer on the list inputs; with guidance, per image "
        "pred = pos + scale * (pos - neg), its norm capped at cfg_normalization x the positive's norm when "
        "cfg_normalization > 0. noise_pred is the negated float32 prediction."
    )

    expected_components = [_TRANSFORMER]

    inputs = [
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

    def __call__(self, components, block_state, i, t):
        outputs = components.transformer(
            block_state.model_latents,
            block_state.model_timestep,
            block_state.model_embeds,
            joint_attention_kwargs=block_state.joint_attention_kwargs,
            return_dict=False,
        )[0]
        if block_state.apply_cfg:
            count = len(block_state.prompt_embeds)
            scale, factor = block_state.step_guidance_scale, block_state.cfg_normalization
            preds = []
            for pos, neg in zip(outputs[:count], outputs[count:], strict=True):
                pos, neg = pos.float(), neg.float()
                pred = pos + scale * (pos - neg)
                if factor and float(factor) > 0.0:
                    pred = _normalize(pred, pos, float(factor))
                preds.append(pred)
            noise_pred = torch.stack(preds, dim=0)
        else:
            noise_pred = torch.stack([out.float() for out in outputs], dim=0)
        # The transformer predicts the velocity towards the image; the scheduler steps along its negative.
        block_state.noise_pred = -noise_pred.squeeze(2)
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

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER, _TRANSFORMER]


class ZImageDenoiseStep(ZImageDenoiseLoopWrapper):
    """The text-to-image and image-to-image denoising loop."""

    block_classes = [ZImageLoopBeforeDenoiser, ZImageLoopDenoiser, ZImageLoopAfterDenoiser]

    description = (
        "Denoises the latents over the timesteps. Each step runs: before_denoiser (model timestep, "
        "guidance doubling, list inputs), denoiser (transformer and guidance), after_denoiser (Euler step)."
    )
