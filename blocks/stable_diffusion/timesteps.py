"""Timestep steps: the scheduler's timesteps, cut by strength for image-to-image and inpainting."""

from __future__ import annotations

import inspect

import torch

from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, SCHEDULER, strength_input

__all__ = [
    "SIGMAS",
    "set_scheduler_timesteps",
    "StableDiffusionSetTimestepsStep",
    "StableDiffusionImg2ImgSetTimestepsStep",
    "StableDiffusionInpaintSetTimestepsStep",
]

_BATCH = InputParam("batch_size", type_hint=int, required=True, description="Number of prompts.")
SIGMAS = InputParam("sigmas", type_hint=list[float], description="Custom sigmas.")


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


class StableDiffusionSetTimestepsStep(ModularPipelineBlocks):
    """Set the scheduler's timesteps for text-to-image."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return "Sets the scheduler's timesteps from num_inference_steps (or custom timesteps or sigmas)."

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("num_inference_steps"),
            InputParam.template("timesteps"),
            SIGMAS,
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam("timesteps", type_hint=torch.Tensor, description="The timesteps to denoise at."),
            OutputParam("num_inference_steps", type_hint=int, description="The number of denoising steps."),
        ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.timesteps, block_state.num_inference_steps = set_scheduler_timesteps(
            components.scheduler,
            block_state.num_inference_steps,
            components._execution_device,
            block_state.timesteps,
            block_state.sigmas,
        )
        self.set_block_state(state, block_state)
        return components, state


class StableDiffusionImg2ImgSetTimestepsStep(ModularPipelineBlocks):
    """Set the timesteps and keep the last ``strength`` part of them, for image-to-image."""

    model_name = MODEL_NAME
    default_strength = 0.8

    @property
    def description(self) -> str:
        return (
            "Sets the scheduler's timesteps, then skips the first (1 - strength) of them, so denoising starts "
            "from the reference image noised to the first kept timestep (latent_timestep)."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("num_inference_steps"),
            InputParam.template("timesteps"),
            SIGMAS,
            strength_input(),
            _BATCH,
            InputParam.template("num_images_per_prompt"),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam("timesteps", type_hint=torch.Tensor, description="The timesteps to denoise at."),
            OutputParam("num_inference_steps", type_hint=int, description="The number of denoising steps."),
            OutputParam(
                "latent_timestep", type_hint=torch.Tensor, description="The first timestep, once per image."
            ),
        ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        strength = self.default_strength if block_state.strength is None else block_state.strength
        if not 0 <= strength <= 1:
            msg = f"{type(self).__name__}: strength must be in [0, 1] (got {strength})"
            raise ValueError(msg)
        scheduler = components.scheduler
        _, steps = set_scheduler_timesteps(
            scheduler,
            block_state.num_inference_steps,
            components._execution_device,
            block_state.timesteps,
            block_state.sigmas,
        )
        kept = min(int(steps * strength), steps)
        start = max(steps - kept, 0)
        timesteps = scheduler.timesteps[start * scheduler.order :]
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(start * scheduler.order)
        if steps - start < 1:
            msg = (
                f"{type(self).__name__}: strength {strength} with num_inference_steps {steps} leaves "
                f"{steps - start} denoising steps; raise strength or num_inference_steps"
            )
            raise ValueError(msg)
        block_state.timesteps, block_state.num_inference_steps = timesteps, steps - start
        total = block_state.batch_size * block_state.num_images_per_prompt
        block_state.latent_timestep = timesteps[:1].repeat(total)
        self.set_block_state(state, block_state)
        return components, state


class StableDiffusionInpaintSetTimestepsStep(StableDiffusionImg2ImgSetTimestepsStep):
    """Img2img timesteps with inpainting's default strength of 1.0 (start from pure noise)."""

    default_strength = 1.0
