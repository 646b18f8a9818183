"""Timestep steps: flow-matching timesteps (shifted by mu where the scheduler asks), cut by strength for
image-to-image and inpainting."""

from __future__ import annotations

from blocks.common.params import BATCH_SIZE, TIMESTEPS_OUTPUTS, tensor_input
from blocks.common.timesteps import StrengthTimestepsStep, flow_kept_steps
from blocks.common.vae import vae_scale_factor
from modular import InputParam, ModularPipelineBlocks

from .utils import MODEL_NAME, SCHEDULER, default_size, patch_size, set_sd3_timesteps

__all__ = [
    "TEXT2IMAGE_STEPS",
    "IMAGE2IMAGE_STEPS",
    "STRENGTH",
    "SIGMAS",
    "MU",
    "steps_input",
    "SD3SetTimestepsStep",
    "SD3Img2ImgSetTimestepsStep",
]

TEXT2IMAGE_STEPS = 28  # StableDiffusion3Pipeline's default
IMAGE2IMAGE_STEPS = 50  # the image-to-image and inpainting pipelines'
STRENGTH = 0.6  # the image-to-image and inpainting pipelines' default strength
STRENGTH_INPUT = InputParam.template("strength", default=STRENGTH)
SIGMAS = InputParam(
    "sigmas", type_hint=list[float], description="Custom sigmas (default: the scheduler's own)."
)
MU = InputParam(
    "mu",
    type_hint=float,
    description="The timestep shift mu (default: from the image size when the scheduler shifts dynamically).",
)


def steps_input(default: int) -> InputParam:
    """``num_inference_steps`` with the workflow's classic default (28 text-to-image, 50 otherwise)."""
    return InputParam.template("num_inference_steps", default=default)


class SD3SetTimestepsStep(ModularPipelineBlocks):
    """Set the timesteps for text-to-image; mu comes from the latents' token count."""

    model_name = MODEL_NAME

    description = (
        "Sets the scheduler's timesteps from num_inference_steps (default 28) or custom sigmas, shifted by `mu` "
        "when given, else, with a dynamically shifting scheduler config (SD 3.5 style), by the mu of the "
        "latents' token count (latent height / patch x latent width / patch)."
    )

    expected_components = [SCHEDULER]

    inputs = [
        steps_input(TEXT2IMAGE_STEPS),
        SIGMAS,
        MU,
        tensor_input("latents", "The initial latents.", required=True),
    ]

    intermediate_outputs = list(TIMESTEPS_OUTPUTS)

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        patch = patch_size(components)
        _, _, height, width = block_state.latents.shape
        block_state.timesteps, block_state.num_inference_steps = set_sd3_timesteps(
            components.scheduler,
            block_state.num_inference_steps,
            block_state.sigmas,
            block_state.mu,
            (height // patch) * (width // patch),
            components._execution_device,
        )
        self.set_block_state(state, block_state)
        return components, state


class SD3Img2ImgSetTimestepsStep(StrengthTimestepsStep):
    """Set the timesteps, then keep the last ``strength`` part of them (image-to-image and inpainting)."""

    model_name = MODEL_NAME
    default_strength = STRENGTH

    description = (
        "Sets the timesteps (default 50 steps; mu from height x width when the scheduler shifts dynamically), "
        "then skips the first (1 - strength) of them (strength default 0.6), so denoising starts from the "
        "image noised to the first kept timestep (latent_timestep)."
    )

    expected_components = [SCHEDULER]

    inputs = [
        steps_input(IMAGE2IMAGE_STEPS),
        SIGMAS,
        MU,
        STRENGTH_INPUT,
        InputParam.template("height"),
        InputParam.template("width"),
        BATCH_SIZE,
        InputParam.template("num_images_per_prompt"),
    ]

    def set_timesteps(self, components, block_state) -> int:
        height, width = default_size(components, block_state.height, block_state.width)
        scale, patch = vae_scale_factor(components), patch_size(components)
        _, steps = set_sd3_timesteps(
            components.scheduler,
            block_state.num_inference_steps,
            block_state.sigmas,
            block_state.mu,
            (int(height) // scale // patch) * (int(width) // scale // patch),
            components._execution_device,
        )
        return steps

    def kept_steps(self, steps: int, strength: float) -> int:
        return flow_kept_steps(steps, strength)
