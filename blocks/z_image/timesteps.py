"""Timestep steps: Z-Image's sigma schedule, shifted for the image size; cut by strength for image-to-image."""

from __future__ import annotations

from blocks.common.params import BATCH_SIZE, HEIGHT_WIDTH_OUTPUTS, TIMESTEPS_OUTPUTS
from blocks.common.timesteps import StrengthTimestepsStep, flow_kept_steps, scheduler_mu
from blocks.common.vae import patched_latent_size
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, SCHEDULER, default_sigmas, resolve_size

__all__ = [
    "SIGMAS",
    "STRENGTH",
    "STRENGTH_INPUT",
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
    latent_height, latent_width = patched_latent_size(components, height, width)
    scheduler = components.scheduler
    mu = scheduler_mu(scheduler, (latent_height // 2) * (latent_width // 2))
    if sigmas is None:
        sigmas = default_sigmas(num_inference_steps)
    scheduler.set_timesteps(sigmas=sigmas, device=components._execution_device, mu=mu)
    return scheduler.timesteps, len(scheduler.timesteps)


def _common_inputs() -> list[InputParam]:
    return [
        InputParam.template("num_inference_steps"),
        SIGMAS,
        InputParam.template("height"),
        InputParam.template("width"),
    ]


def _common_outputs() -> list[OutputParam]:
    return [*TIMESTEPS_OUTPUTS, *HEIGHT_WIDTH_OUTPUTS]


class ZImageSetTimestepsStep(ModularPipelineBlocks):
    """Set the scheduler's timesteps for text-to-image."""

    model_name = MODEL_NAME

    description = (
        "Resolves height and width (1024 by default; multiples of 16 for Z-Image's VAE), and sets the "
        "scheduler's timesteps from sigmas 1 .. 1/num_inference_steps (or custom sigmas) with the shift mu "
        "of the image's sequence length."
    )

    expected_components = [SCHEDULER]

    inputs = _common_inputs()

    intermediate_outputs = _common_outputs()

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


class ZImageImg2ImgSetTimestepsStep(StrengthTimestepsStep):
    """Set the timesteps and keep the last ``strength`` part of them, for image-to-image."""

    model_name = MODEL_NAME
    default_strength = STRENGTH

    description = (
        "Sets the timesteps as for text-to-image, then skips the first (1 - strength) of them (strength "
        "0.6 by default), so denoising starts from the image latents noised to the first kept timestep "
        "(latent_timestep)."
    )

    expected_components = [SCHEDULER]

    inputs = [*_common_inputs(), STRENGTH_INPUT, BATCH_SIZE, InputParam.template("num_images_per_prompt")]

    intermediate_outputs = [*StrengthTimestepsStep.intermediate_outputs, *HEIGHT_WIDTH_OUTPUTS]

    def set_timesteps(self, components, block_state) -> int:
        height, width = resolve_size(self, components, block_state.height, block_state.width)
        _, steps = set_z_image_timesteps(
            components, block_state.num_inference_steps, block_state.sigmas, height, width
        )
        block_state.height, block_state.width = height, width
        return steps

    def kept_steps(self, steps: int, strength: float) -> int:
        return flow_kept_steps(steps, strength)
