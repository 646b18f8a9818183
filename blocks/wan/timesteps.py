"""The timesteps step: the scheduler's own schedule (UniPC over shifted flow sigmas in the published repos)."""

from __future__ import annotations

from blocks.common.params import TIMESTEPS_OUTPUTS
from modular import InputParam, ModularPipelineBlocks

from .utils import MODEL_NAME, SCHEDULER

__all__ = ["WanSetTimestepsStep"]


class WanSetTimestepsStep(ModularPipelineBlocks):
    """Set the scheduler's timesteps for num_inference_steps, as the classic pipelines do."""

    model_name = MODEL_NAME

    description = (
        "Sets the scheduler's timesteps with scheduler.set_timesteps(num_inference_steps): its own spacing "
        "and shift (flow_shift for UniPC), and starts it at the first one."
    )

    expected_components = [SCHEDULER]

    inputs = [InputParam.template("num_inference_steps")]

    intermediate_outputs = list(TIMESTEPS_OUTPUTS)

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        scheduler = components.scheduler
        scheduler.set_timesteps(block_state.num_inference_steps, device=components._execution_device)
        scheduler.set_begin_index(0)
        block_state.timesteps = scheduler.timesteps
        block_state.num_inference_steps = len(scheduler.timesteps)
        self.set_block_state(state, block_state)
        return components, state
