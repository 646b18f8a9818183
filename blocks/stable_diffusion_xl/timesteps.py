"""Timestep steps: the scheduler's timesteps, cut by strength / denoising_start and by denoising_end."""

from __future__ import annotations

import torch

from blocks.common.params import BATCH_SIZE, LATENT_TIMESTEP_OUTPUT, TIMESTEPS_OUTPUTS
from blocks.common.timesteps import checked_strength
from blocks.stable_diffusion.timesteps import TIMESTEP_INPUTS, kept_steps, set_scheduler_timesteps
from blocks.stable_diffusion.utils import SCHEDULER, strength_input, with_strength_default
from modular import InputParam, ModularPipelineBlocks

from .utils import IMG2IMG_STRENGTH, INPAINT_STRENGTH, MODEL_NAME

__all__ = [
    "DENOISING_START",
    "is_fraction",
    "StableDiffusionXLSetTimestepsStep",
    "StableDiffusionXLImg2ImgSetTimestepsStep",
    "StableDiffusionXLInpaintSetTimestepsStep",
]


def is_fraction(value) -> bool:
    """The classic pipelines honour denoising_start / denoising_end only as a float strictly inside (0, 1)."""
    return isinstance(value, float) and 0 < value < 1


def _cutoff(scheduler, fraction: float) -> int:
    """The training timestep at which a fraction of the denoising is done."""
    train = scheduler.config.num_train_timesteps
    return int(round(train - fraction * train))


def _end_at(scheduler, timesteps: torch.Tensor, denoising_end) -> tuple[torch.Tensor, int]:
    """The timesteps to run when denoising stops early at `denoising_end` (for an ensemble of experts)."""
    if not is_fraction(denoising_end):
        return timesteps, len(timesteps)
    cutoff = _cutoff(scheduler, denoising_end)
    count = len([t for t in timesteps if t >= cutoff])
    return timesteps[:count], count


DENOISING_START = InputParam(
    "denoising_start",
    type_hint=float,
    description="Start when this fraction of the denoising is done (0 < x < 1); strength is then ignored.",
)
_TIMESTEP_INPUTS = [
    *TIMESTEP_INPUTS,
    InputParam(
        "denoising_end",
        type_hint=float,
        description="Stop when this fraction of the denoising is done (0 < x < 1), leaving the rest to a refiner.",
    ),
]


class StableDiffusionXLSetTimestepsStep(ModularPipelineBlocks):
    """Set the scheduler's timesteps for text-to-image, cut at denoising_end."""

    model_name = MODEL_NAME

    description = (
        "Sets the scheduler's timesteps from num_inference_steps (or custom timesteps or sigmas), keeps those "
        "before denoising_end, and starts the scheduler at index 0."
    )

    expected_components = [SCHEDULER]

    inputs = list(_TIMESTEP_INPUTS)

    intermediate_outputs = list(TIMESTEPS_OUTPUTS)

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        scheduler = components.scheduler
        timesteps, _ = set_scheduler_timesteps(
            scheduler, bs.num_inference_steps, components._execution_device, bs.timesteps, bs.sigmas
        )
        bs.timesteps, bs.num_inference_steps = _end_at(scheduler, timesteps, bs.denoising_end)
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
        self.set_block_state(state, bs)
        return components, state


class StableDiffusionXLImg2ImgSetTimestepsStep(ModularPipelineBlocks):
    """Set the timesteps for image-to-image: skip the first ``1 - strength`` (or up to denoising_start)."""

    model_name = MODEL_NAME
    default_strength = IMG2IMG_STRENGTH

    description = (
        "Sets the scheduler's timesteps, then skips the first (1 - strength) of them (default strength 0.3), "
        "or, with denoising_start, those before that fraction of the denoising (the image is then taken as "
        "already noised). latent_timestep is the first kept timestep, once per image. denoising_end cuts the end."
    )

    expected_components = [SCHEDULER]

    inputs = [
        *_TIMESTEP_INPUTS,
        DENOISING_START,
        strength_input(IMG2IMG_STRENGTH),
        BATCH_SIZE,
        InputParam.template("num_images_per_prompt"),
    ]

    intermediate_outputs = [*TIMESTEPS_OUTPUTS, LATENT_TIMESTEP_OUTPUT]

    def _start(self, scheduler, steps: int, strength: float, denoising_start) -> int:
        """The index of the first timestep to run."""
        if not is_fraction(denoising_start):
            return (steps - kept_steps(steps, strength)) * scheduler.order
        remaining = int((scheduler.timesteps < _cutoff(scheduler, denoising_start)).sum().item())
        # A second-order scheduler must not stop between the two halves of a step.
        if scheduler.order == 2 and remaining % 2 == 0:
            remaining += 1
        return len(scheduler.timesteps) - remaining

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        strength = checked_strength(self, bs.strength, self.default_strength)
        start, end = bs.denoising_start, bs.denoising_end
        if is_fraction(start) and is_fraction(end) and start >= end:
            msg = f"{type(self).__name__}: denoising_start ({start}) must be below denoising_end ({end})"
            raise ValueError(msg)
        scheduler = components.scheduler
        _, steps = set_scheduler_timesteps(
            scheduler, bs.num_inference_steps, components._execution_device, bs.timesteps, bs.sigmas
        )
        first = self._start(scheduler, steps, strength, start)
        timesteps = scheduler.timesteps[first:]
        if len(timesteps) < 1:
            msg = (
                f"{type(self).__name__}: strength {strength} with num_inference_steps {steps} leaves no "
                "denoising steps; raise strength or num_inference_steps"
            )
            raise ValueError(msg)
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(first)
        bs.latent_timestep = timesteps[:1].repeat(bs.batch_size * bs.num_images_per_prompt)
        bs.timesteps, bs.num_inference_steps = _end_at(scheduler, timesteps, end)
        self.set_block_state(state, bs)
        return components, state


class StableDiffusionXLInpaintSetTimestepsStep(StableDiffusionXLImg2ImgSetTimestepsStep):
    """Image-to-image timesteps with inpainting's default strength of 0.9999."""

    default_strength = INPAINT_STRENGTH

    inputs = with_strength_default(StableDiffusionXLImg2ImgSetTimestepsStep.inputs, INPAINT_STRENGTH)
