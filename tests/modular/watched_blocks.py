"""Small blocks whose denoising-like loop tells the call's watch what it does, as every family's loop does.

``Setup`` makes ``timesteps`` (``num_steps`` of them) and tags ``embeds`` into the ``denoiser_input_fields``
group; ``StepLoop`` runs ``AddEmbeds`` once per timestep (``latents = 2 * latents + embeds``), so from zero
latents and ``embeds`` of ones the result after ``n`` steps is ``2**n - 1``: the output tells how many steps ran.
Every block appends its name to ``RAN`` when it runs (a test clears it), so a test sees what ran before an error.
"""

import torch

from modular import (
    InputParam,
    LoopSequentialPipelineBlocks,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)
from modular.watch.watch import watch_of

#: The blocks and steps that ran, in order: "setup", then "step" once per loop step.
RAN: list[str] = []


class Setup(ModularPipelineBlocks):
    """embeds, num_steps -> timesteps; embeds tagged into denoiser_input_fields."""

    inputs = [InputParam("embeds", required=True), InputParam("num_steps", type_hint=int, default=3)]

    intermediate_outputs = [
        OutputParam("timesteps"),
        OutputParam("embeds", kwargs_type="denoiser_input_fields"),
    ]

    def __call__(self, components, state):
        RAN.append("setup")
        block_state = self.get_block_state(state)
        block_state.timesteps = torch.arange(block_state.num_steps, 0, -1)
        self.set_block_state(state, block_state)
        return components, state


class AddEmbeds(ModularPipelineBlocks):
    """One step: latents = 2 * latents + embeds (embeds read by name and, the same value, in its group)."""

    inputs = [
        InputParam("latents", required=True),
        InputParam("embeds", required=True),
        InputParam(kwargs_type="denoiser_input_fields"),
    ]

    intermediate_outputs = [OutputParam("latents")]

    def __call__(self, components, block_state, i, t):
        RAN.append("step")
        # A callback's replacement reaches the group too (what a denoiser reading the group sees).
        assert block_state.embeds is block_state.denoiser_input_fields["embeds"]
        block_state.latents = 2 * block_state.latents + block_state.embeds
        return components, block_state


class StepLoop(LoopSequentialPipelineBlocks):
    """Runs AddEmbeds once per timestep, telling the call's watch as blocks/common/denoise_loop.py does."""

    block_classes = [AddEmbeds]
    block_names = ["step"]

    # negative_embeds is offered but no block here makes it: a call asking for it has no value for it.
    _callback_tensor_inputs = ("latents", "embeds", "negative_embeds")

    @property
    def loop_inputs(self):
        return [InputParam("timesteps", required=True)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        watch = watch_of(components)
        if watch is not None:
            watch.loop_started(self, len(block_state.timesteps), block_state)
        for i, t in enumerate(block_state.timesteps):
            if watch is not None and watch.stops_before_step(i):
                break
            components, block_state = self.loop_step(components, block_state, i=i, t=t)
            if watch is not None:
                watch.step_finished(self, components, block_state, t)
        self.set_block_state(state, block_state)
        return components, state


class LatentsOnlyLoop(StepLoop):
    """A loop offering only latents."""

    _callback_tensor_inputs = ("latents",)


def watched_pipeline(loops: int = 1):
    """setup, denoise_0[, setup_1, denoise_1 ...]: one Setup and one StepLoop per loop."""
    blocks: dict = {}
    for i in range(loops):
        blocks["setup" if i == 0 else f"setup_{i}"] = Setup
        blocks[f"denoise_{i}"] = StepLoop
    pipe = SequentialPipelineBlocks.from_blocks_dict(blocks).init_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, **kwargs):
    """A call from zero latents and embeds of ones, returning the latents."""
    return pipe(latents=torch.zeros(1, 2), embeds=torch.ones(1, 2), output="latents", **kwargs)
