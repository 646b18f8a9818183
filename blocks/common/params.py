"""Inputs and outputs that several families' blocks declare, written once so they read the same everywhere.

The framework's own templates (``InputParam.template("prompt")`` ...) cover what a user passes; these
cover what the blocks hand each other: the batch, the dtype, timesteps and the image latents.
"""

from __future__ import annotations

import torch

from modular import InputParam, OutputParam

__all__ = [
    "BATCH_INPUTS",
    "BATCH_SIZE",
    "BATCH_SIZE_OUTPUT",
    "DTYPE",
    "DTYPE_OUTPUT",
    "HEIGHT_WIDTH_OUTPUTS",
    "INITIAL_LATENTS_OUTPUT",
    "LATENT_TIMESTEP",
    "LATENT_TIMESTEP_OUTPUT",
    "SIGMAS",
    "TIMESTEPS_OUTPUTS",
    "tensor_input",
    "tensor_output",
]

BATCH_SIZE = InputParam("batch_size", type_hint=int, required=True, description="Number of prompts.")
BATCH_SIZE_OUTPUT = OutputParam("batch_size", type_hint=int, description="Number of prompts.")
BATCH_INPUTS = (
    InputParam.template("generator"),
    BATCH_SIZE,
    InputParam.template("num_images_per_prompt"),
)
"""What a step that draws noise or encodes images for the whole batch reads: the generator (one, or one
per image), the number of prompts and the images per prompt."""
DTYPE = InputParam("dtype", type_hint=torch.dtype, description="The dtype of the model inputs.")
DTYPE_OUTPUT = OutputParam("dtype", type_hint=torch.dtype, description="The dtype of the model inputs.")

SIGMAS = InputParam("sigmas", type_hint=list[float], description="Custom sigmas.")
TIMESTEPS_OUTPUTS = (
    OutputParam("timesteps", type_hint=torch.Tensor, description="The timesteps to denoise at."),
    OutputParam("num_inference_steps", type_hint=int, description="The number of denoising steps."),
)
LATENT_TIMESTEP = InputParam(
    "latent_timestep", type_hint=torch.Tensor, required=True, description="The first timestep."
)
LATENT_TIMESTEP_OUTPUT = OutputParam(
    "latent_timestep", type_hint=torch.Tensor, description="The first timestep, once per image."
)

INITIAL_LATENTS_OUTPUT = OutputParam(
    "latents", type_hint=torch.Tensor, description="The initial latents to denoise."
)
HEIGHT_WIDTH_OUTPUTS = (
    OutputParam("height", type_hint=int, description="The image height in pixels."),
    OutputParam("width", type_hint=int, description="The image width in pixels."),
)


def tensor_input(name: str, description: str, required: bool = False) -> InputParam:
    """A tensor the block reads from the state (latents, masks, embeddings a previous block made)."""
    return InputParam(name, type_hint=torch.Tensor, required=required, description=description)


def tensor_output(name: str, description: str) -> OutputParam:
    """A tensor the block writes into the state for later blocks."""
    return OutputParam(name, type_hint=torch.Tensor, description=description)
