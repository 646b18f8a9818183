"""Timestep steps: Z-Image's sigma schedule, shifted for the image size; cut by strength for image-to-image."""

from __future__ import annotations

import torch

from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, SCHEDULER, calculate_shift, default_sigmas, latent_size, resolve_size

__all__ = [
    "SIGMAS",
    "STRENGTH",
    "STRENGTH_INPUT",
    "kept_steps",
    "set_z_image_timesteps",
    "ZImageSetTimestepsStep",
    "ZImageImg2ImgSetTimestepsStep",
]

STRENGTH = 0.6  # the classic image-to-image pipeline's default
STRENGTH_INPUT = InputParam.template("strength", default=STRENGTH)
SIGMAS = InputParam("sigmas", type_hint=list[float], description="Custom sigmas (default: 1 .. 1/steps).")


def set_z_image_timesteps(components, num_inference_steps: int, sigmas, height: int, width: int):
    """Set the scheduler's timesteps from `sigmas` (default: 1 .. 1/n) and the shift ``mu`` for the image
    size; return the timesteps and their count."""
    latent_height, latent_width = latent_size(components, height, width)
    scheduler = components.scheduler
    config = scheduler.config
    mu = calculate_shift(
        (latent_height // 2) * (latent_width // 2),
        config.get("base_image_seq_len", 256),
        config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.5),
        config.get("max_shift", 1.15),
    )
    if sigmas is None:
        sigmas = default_sigmas(num_inference_steps)
    scheduler.set_timesteps(sigmas=sigmas, device=components._execution_device, mu=mu)
    return scheduler.timesteps, len(scheduler.timesteps)


def kept_steps(steps: int, strength: float) -> int:
    """How many of `steps` steps image-to-image runs at `strength`: the classic pipeline counts in floats."""
    return steps - int(max(steps - min(steps * strength, steps), 0))


def _common_inputs() -> list[InputParam]:
    return [
        InputParam.template("num_inference_steps"),
        SIGMAS,
        InputParam.template("height"),
        InputParam.template("width"),
    ]


def _common_outputs() -> list[OutputParam]:
    return [
        OutputParam("timesteps", type_hint=torch.Tensor, description="The timesteps to denoise at."),
        OutputParam("num_inference_steps", type_hint=int, description="The number of denoising steps."),
        OutputParam("height", type_hint=int, description="The image height in pixels."),
        OutputParam("width", type_hint=int, description="The image width in pixels."),
    ]


class ZImageSetTimestepsStep(ModularPipelineBlocks):
    """Set the scheduler's timesteps for text-to-image."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Resolves height and width (1024 by default; multiples of 16 for Z-Image's VAE), and sets the "
            "scheduler's timesteps from sigmas 1 .. 1/num_inference_steps (or custom sigmas) with the shift mu "
            "of the image's sequence length."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return _common_inputs()

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return _common_outputs()

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = resolve_size(self, components, block_state.height, block_state.width)
        block_state.timesteps, block_state.num_inference_steps = set_z_image_timesteps(
            components, block_state.num_inference_steps, block_state.sigmas, height, width
        )
        components.scheduler.set_begin_index(0)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


class ZImageImg2ImgSetTimestepsStep(ModularPipelineBlocks):
    """Set the timesteps and keep the last ``strength`` part of them, for image-to-image."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Sets the timesteps as for text-to-image, then skips the first (1 - strength) of them (strength "
            "0.6 by default), so denoising starts from the image latents noised to the first kept timestep "
            "(latent_timestep)."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [SCHEDULER]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *_common_inputs(),
            STRENGTH_INPUT,
            InputParam("batch_size", type_hint=int, required=True, description="Number of prompts."),
            InputParam.template("num_images_per_prompt"),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            *_common_outputs(),
            OutputParam(
                "latent_timestep", type_hint=torch.Tensor, description="The first timestep, once per image."
            ),
        ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        strength = block_state.strength
        if not 0 <= strength <= 1:
            msg = f"{type(self).__name__}: strength must be in [0, 1] (got {strength})"
            raise ValueError(msg)
        height, width = resolve_size(self, components, block_state.height, block_state.width)
        scheduler = components.scheduler
        _, steps = set_z_image_timesteps(
            components, block_state.num_inference_steps, block_state.sigmas, height, width
        )
        start = steps - kept_steps(steps, strength)
        if steps - start < 1:
            msg = (
                f"{type(self).__name__}: strength {strength} with num_inference_steps {steps} leaves "
                f"{steps - start} denoising steps; raise strength or num_inference_steps"
            )
            raise ValueError(msg)
        timesteps = scheduler.timesteps[start * scheduler.order :]
        scheduler.set_begin_index(start * scheduler.order)
        block_state.timesteps, block_state.num_inference_steps = timesteps, steps - start
        total = block_state.batch_size * block_state.num_images_per_prompt
        block_state.latent_timestep = timesteps[:1].repeat(total)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state
