"""The timestep step: flow-matching sigmas shifted by Flux.2's empirical mu (image tokens and step count)."""

from __future__ import annotations

import numpy as np

from blocks.common.params import TIMESTEPS_OUTPUTS, tensor_input
from modular import InputParam, ModularPipelineBlocks

from .utils import MODEL_NAME, SCHEDULER

__all__ = ["NUM_INFERENCE_STEPS", "SIGMAS", "TIMESTEP_INPUTS", "Flux2SetTimestepsStep"]

NUM_INFERENCE_STEPS = InputParam.template("num_inference_steps", default=50)
SIGMAS = InputParam(
    "sigmas", type_hint=list[float], description="Custom sigmas (default: linspace(1, 1 / steps, steps))."
)
TIMESTEP_INPUTS = (NUM_INFERENCE_STEPS, SIGMAS)


class Flux2SetTimestepsStep(ModularPipelineBlocks):
    """Set the timesteps, shifted by mu from the number of image tokens and of steps."""

    model_name = MODEL_NAME

    description = (
        "Sets the scheduler's timesteps from sigmas (default linspace(1, 1 / steps, steps); the scheduler's own "
        "with use_flow_sigmas), shifted by Flux.2's empirical mu, which follows the number of latent tokens of "
        "the generated image and num_inference_steps."
    )

    expected_components = [SCHEDULER]

    inputs = [*TIMESTEP_INPUTS, tensor_input("latents", "The packed latents.", required=True)]

    intermediate_outputs = list(TIMESTEPS_OUTPUTS)

    def __call__(self, components, state):
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, retrieve_timesteps

        block_state = self.get_block_state(state)
        scheduler, steps = components.scheduler, block_state.num_inference_steps
        sigmas = np.linspace(1.0, 1 / steps, steps) if block_state.sigmas is None else block_state.sigmas
        if scheduler.config.get("use_flow_sigmas", False):
            sigmas = None
        mu = compute_empirical_mu(image_seq_len=block_state.latents.shape[1], num_steps=steps)
        block_state.timesteps, block_state.num_inference_steps = retrieve_timesteps(
            scheduler, steps, components._execution_device, sigmas=sigmas, mu=mu
        )
        # Start at the first timestep without a device-to-host lookup, as the classic pipeline does.
        scheduler.set_begin_index(0)
        self.set_block_state(state, block_state)
        return components, state
