"""Timestep steps: the scheduler's timesteps, cut by strength for image-to-image and inpainting."""

from __future__ import annotations

import inspect

from blocks.common.params import BATCH_SIZE, SIGMAS, TIMESTEPS_OUTPUTS
from blocks.common.timesteps import StrengthTimestepsStep
from modular import InputParam, ModularPipelineBlocks

from .outdated_configs import INPAINT_SCHEDULER_FIXES, TEXT2IMAGE_SCHEDULER_FIXES, fix_outdated_scheduler
from .utils import (
    IMG2IMG_STRENGTH,
    INPAINT_STRENGTH,
    MODEL_NAME,
    SCHEDULER,
    strength_input,
    with_strength_default,
)

__all__ = [
    "TIMESTEP_INPUTS",
    "kept_steps",
    "set_scheduler_timesteps",
    "StableDiffusionSetTimestepsStep",
    "StableDiffusionImg2ImgSetTimestepsStep",
    "StableDiffusionInpaintSetTimestepsStep",
]


# How many steps to run, or which: the count, or custom timesteps or sigmas.
TIMESTEP_INPUTS = (InputParam.template("num_inference_steps"), InputParam.template("timesteps"), SIGMAS)


def set_scheduler_timesteps(scheduler, num_inference_steps, device, timesteps=None, sigmas=None):
    """Set the scheduler's timesteps (a count, custom timesteps or custom sigmas); return them and their count."""
    if timesteps is not None and sigmas is not None:
        msg = "set_timesteps: pass custom timesteps or custom sigmas, not both"
        raise ValueError(msg)
    custom = (
        {"timesteps": timesteps}
        if timesteps is not None
        else {"sigmas": sigmas}
        if sigmas is not None
        else {}
    )
    if custom:
        (name,) = custom
        if name not in inspect.signature(scheduler.set_timesteps).parameters:
            msg = f"set_timesteps: {type(scheduler).__name__} does not accept custom {name}; use another scheduler"
            raise ValueError(msg)
        scheduler.set_timesteps(device=device, **custom)
        return scheduler.timesteps, len(scheduler.timesteps)
    scheduler.set_timesteps(num_inference_steps, device=device)
    return scheduler.timesteps, num_inference_steps


def kept_steps(steps: int, strength: float) -> int:
    """How many of `steps` denoising steps image-to-image runs at `strength`, as the classic pipelines."""
    return min(int(steps * strength), steps)


class StableDiffusionSetTimestepsStep(ModularPipelineBlocks):
    """Set the scheduler's timesteps for text-to-image."""

    model_name = MODEL_NAME

    description = "Sets the scheduler's timesteps from num_inference_steps (or custom timesteps or sigmas)."

    expected_components = [SCHEDULER]

    inputs = list(TIMESTEP_INPUTS)

    intermediate_outputs = list(TIMESTEPS_OUTPUTS)

    # The classic pipeline of this workflow and the fixes it makes to an outdated scheduler config.
    classic_pipeline = "StableDiffusionPipeline"
    scheduler_fixes = TEXT2IMAGE_SCHEDULER_FIXES

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        fix_outdated_scheduler(components.scheduler, self.scheduler_fixes, self.classic_pipeline)
        block_state.timesteps, block_state.num_inference_steps = set_scheduler_timesteps(
            components.scheduler,
            block_state.num_inference_steps,
            components._execution_device,
            block_state.timesteps,
            block_state.sigmas,
        )
        self.set_block_state(state, block_state)
        return components, state


class StableDiffusionImg2ImgSetTimestepsStep(StrengthTimestepsStep):
    """Set the timesteps and keep the last ``strength`` part of them, for image-to-image."""

    model_name = MODEL_NAME
    default_strength = IMG2IMG_STRENGTH

    description = (
        "Sets the scheduler's timesteps, then skips the first (1 - strength) of them, so denoising starts "
        "from the reference image noised to the first kept timestep (latent_timestep)."
    )

    expected_components = [SCHEDULER]

    inputs = [
        *TIMESTEP_INPUTS,
        strength_input(IMG2IMG_STRENGTH),
        BATCH_SIZE,
        InputParam.template("num_images_per_prompt"),
    ]

    # The classic pipeline of this workflow and the fixes it makes to an outdated scheduler config.
    classic_pipeline = "StableDiffusionImg2ImgPipeline"
    scheduler_fixes = TEXT2IMAGE_SCHEDULER_FIXES

    def set_timesteps(self, components, block_state) -> int:
        fix_outdated_scheduler(components.scheduler, self.scheduler_fixes, self.classic_pipeline)
        _, steps = set_scheduler_timesteps(
            components.scheduler,
            block_state.num_inference_steps,
            components._execution_device,
            block_state.timesteps,
            block_state.sigmas,
        )
        return steps

    def kept_steps(self, steps: int, strength: float) -> int:
        return kept_steps(steps, strength)


class StableDiffusionInpaintSetTimestepsStep(StableDiffusionImg2ImgSetTimestepsStep):
    """Img2img timesteps with inpainting's default strength of 1.0 (start from pure noise)."""

    default_strength = INPAINT_STRENGTH
    classic_pipeline = "StableDiffusionInpaintPipeline"
    scheduler_fixes = INPAINT_SCHEDULER_FIXES

    inputs = with_strength_default(StableDiffusionImg2ImgSetTimestepsStep.inputs, INPAINT_STRENGTH)
