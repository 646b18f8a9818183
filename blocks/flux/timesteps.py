"""Timestep steps: flow-matching sigmas shifted by the image size (mu), cut by strength for image-to-image."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.params import BATCH_SIZE, TIMESTEPS_OUTPUTS, tensor_input
from blocks.common.timesteps import StrengthTimestepsStep, flow_kept_steps, scheduler_mu
from blocks.common.vae import patched_latent_size
from modular import InputParam, ModularPipelineBlocks

from .utils import MODEL_NAME, SCHEDULER, default_sigmas, default_size

__all__ = [
    "NUM_INFERENCE_STEPS",
    "SIGMAS",
    "IMG2IMG_STRENGTH",
    "STRENGTH",
    "TIMESTEP_INPUTS",
    "set_flux_timesteps",
    "FluxSetTimestepsStep",
    "FluxImg2ImgSetTimestepsStep",
]

NUM_INFERENCE_STEPS = InputParam.template("num_inference_steps", default=28)
SIGMAS = InputParam(
    "sigmas", type_hint=list[float], description="Custom sigmas (default: linspace(1, 1 / steps, steps))."
)
# FluxImg2ImgPipeline's default strength.
IMG2IMG_STRENGTH = 0.6
STRENGTH = InputParam.template("strength", default=IMG2IMG_STRENGTH)
TIMESTEP_INPUTS = (NUM_INFERENCE_STEPS, SIGMAS)


def set_flux_timesteps(
    scheduler: Any, num_inference_steps: int, sigmas: Any, image_seq_len: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    """Set the scheduler's timesteps from `sigmas` (None: the scheduler's own spacing) shifted by mu.

    Returns:
        The timesteps and their count.
    """
    mu = scheduler_mu(scheduler, image_seq_len)
    if sigmas is None:
        scheduler.set_timesteps(num_inference_steps, device=device, mu=mu)
        return scheduler.timesteps, num_inference_steps
    scheduler.set_timesteps(sigmas=sigmas, device=device, mu=mu)
    return scheduler.timesteps, len(scheduler.timesteps)


class FluxSetTimestepsStep(ModularPipelineBlocks):
    """Set the timesteps for text-to-image and control, shifted by the packed latents' length."""

    model_name = MODEL_NAME

    description = (
        "Sets the scheduler's timesteps from sigmas (default linspace(1, 1 / steps, steps); the scheduler's "
        "own with use_flow_sigmas), shifted by mu, which grows linearly with the number of latent tokens."
    )

    expected_components = [SCHEDULER]

    inputs = [
        *TIMESTEP_INPUTS,
        tensor_input("latents", "The packed latents.", required=True),
    ]

    intermediate_outputs = list(TIMESTEPS_OUTPUTS)

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        scheduler, steps = components.scheduler, block_state.num_inference_steps
        sigmas = default_sigmas(steps) if block_state.sigmas is None else block_state.sigmas
        if scheduler.config.get("use_flow_sigmas", False):
            sigmas = None
        block_state.timesteps, block_state.num_inference_steps = set_flux_timesteps(
            scheduler, steps, sigmas, block_state.latents.shape[1], components._execution_device
        )
        # Start at the first timestep without a device-to-host lookup, as the classic pipeline does.
        scheduler.set_begin_index(0)
        self.set_block_state(state, block_state)
        return components, state


class FluxImg2ImgSetTimestepsStep(StrengthTimestepsStep):
    """Set the timesteps, then keep the last ``strength`` part of them, for image-to-image."""

    model_name = MODEL_NAME
    default_strength = IMG2IMG_STRENGTH

    description = (
        "Sets the shifted timesteps (mu from height x width), then skips the first (1 - strength) of them "
        "(strength default 0.6), so denoising starts from the image noised to the first kept timestep "
        "(latent_timestep)."
    )

    expected_components = [SCHEDULER]

    inputs = [
        *TIMESTEP_INPUTS,
        STRENGTH,
        InputParam.template("height"),
        InputParam.template("width"),
        BATCH_SIZE,
        InputParam.template("num_images_per_prompt"),
    ]

    def set_timesteps(self, components, block_state) -> int:
        steps = block_state.num_inference_steps
        sigmas = default_sigmas(steps) if block_state.sigmas is None else block_state.sigmas
        height, width = patched_latent_size(
            components, *default_size(components, block_state.height, block_state.width)
        )
        _, steps = set_flux_timesteps(
            components.scheduler, steps, sigmas, (height // 2) * (width // 2), components._execution_device
        )
        return steps

    def kept_steps(self, steps: int, strength: float) -> int:
        return flow_kept_steps(steps, strength)
