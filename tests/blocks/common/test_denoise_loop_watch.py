"""Every family's denoising loop (TimestepLoopBlocks) and the call's watch, on a model-free loop body."""

import io
import re

import pytest
import torch

from blocks.common.denoise_loop import TimestepLoopBlocks
from modular import InputParam, ModularPipelineBlocks, OutputParam

STEPS_RUN: list[int] = []


class AddOne(ModularPipelineBlocks):
    inputs = [InputParam("latents", required=True)]

    intermediate_outputs = [OutputParam("latents")]

    def __call__(self, components, block_state, i, t):
        STEPS_RUN.append(i)
        block_state.latents = block_state.latents + 1
        return components, block_state


class Loop(TimestepLoopBlocks):
    block_classes = [AddOne]
    block_names = ["step"]
    _callback_tensor_inputs = ("latents", "prompt_embeds")  # prompt_embeds: offered, no block here has it


def call(pipe, **kwargs):
    STEPS_RUN.clear()
    timesteps = torch.tensor([3, 2, 1])
    return pipe(
        latents=torch.zeros(1), timesteps=timesteps, num_inference_steps=3, output="latents", **kwargs
    )


def test_a_name_the_loop_has_no_value_for_fails_before_its_first_step():
    """The family loop hands its block state to the watch as it starts: a name it offers but has no value for
    in this call is a ValueError before any step runs."""
    pipe = Loop().init_pipeline()
    pipe.set_progress_bar_config(disable=True)
    with pytest.raises(ValueError, match=r"asks for \['prompt_embeds'\].*has no value for in this call"):
        call(pipe, callback_on_step_end=lambda *a: {}, callback_on_step_end_tensor_inputs=["prompt_embeds"])
    assert STEPS_RUN == []
    assert torch.equal(call(pipe, callback_on_step_end=lambda *a: {}), torch.full((1,), 3.0))


def test_the_bar_is_the_same_with_progress_events():
    """on_progress adds events and leaves the tqdm bar as it is: the same counts, ending at 3/3."""
    counts = []
    for watching in ({}, {"on_progress": lambda event: None}):
        pipe = Loop().init_pipeline()
        bar = io.StringIO()
        pipe.set_progress_bar_config(file=bar, mininterval=0)
        call(pipe, **watching)
        counts.append(re.findall(r"\d+/\d+", bar.getvalue()))  # times and rates differ from run to run
    assert counts[0] == counts[1]
    assert counts[0][-1] == "3/3"
