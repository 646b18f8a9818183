"""Watching a call: the step callback's contract (the peer's and diffusers'), interrupt, callback objects, and
what is checked before anything runs, on small hand-written blocks (tests/modular/watched_blocks.py)."""

import pytest
import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

from modular import (
    ConditionalPipelineBlocks,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)
from modular.framework.call_watch import CallWatch

from .watched_blocks import RAN, LatentsOnlyLoop, Setup, run, watched_pipeline


@pytest.fixture(autouse=True)
def _clear_ran():
    RAN.clear()
    yield
    RAN.clear()


def keeps_no_callback(pipe):
    """Nothing of the call stays on the pipeline: no watch, no callback (the peer's field stays None)."""
    return pipe._callback_on_step_end is None and not any(
        isinstance(value, CallWatch) or callable(value) and getattr(value, "__name__", "") == "<lambda>"
        for value in vars(pipe).values()
    )


# (callback, tensor inputs, error, what ran before it was raised, a fragment of its message)
BAD_CALLS = {
    "returns_none": (lambda *a: None, None, TypeError, ["setup", "step"], "must return a dict"),
    "returns_unknown_name": (
        lambda *a: {"invalid": 1},
        None,
        ValueError,
        ["setup", "step"],
        r"returned \['invalid'\], which the denoising loop StepLoop does not offer",
    ),
    "asks_unknown_name": (
        lambda *a: {},
        ["invalid"],
        ValueError,
        [],
        r"asks for \['invalid'\], which the denoising loop StepLoop does not offer",
    ),
    "asks_offered_name_without_a_value": (
        lambda *a: {},
        ["negative_embeds"],
        ValueError,
        ["setup"],
        r"\['negative_embeds'\].*no value",
    ),
    "not_callable": (0, None, TypeError, [], "callback_on_step_end must be callable"),
    "names_without_callback": (None, ["invalid"], ValueError, [], r"asks for \['invalid'\]"),
    "names_not_a_list": (lambda *a: {}, "latents", TypeError, [], "must be a list of tensor names"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_a_bad_callback_raises_at_its_time_and_leaves_the_pipeline_clean(case):
    """Each bad callback or tensor-input list raises its TypeError/ValueError: the keyword checks and the
    tensor names before any block runs, a name the loop has no value for before the loop's first step, a bad
    return value at the first step (the only time it can be seen). The flag is reset, no callback is kept, and
    the next call runs as a fresh one."""
    callback, inputs, error, ran, message = BAD_CALLS[case]
    pipe = watched_pipeline()
    fresh = run(pipe)
    pipe.interrupt = True
    RAN.clear()
    with pytest.raises(error, match=message):
        run(pipe, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=inputs)
    assert RAN == ran
    assert pipe.interrupt is False
    assert keeps_no_callback(pipe)
    assert torch.equal(run(pipe), fresh)


def test_returned_values_land_in_the_block_state_and_in_a_group_holding_them():
    """A callback's replacement reaches the next steps by name and through the kwargs_type group that held the
    same value (AddEmbeds asserts both are one object); names not returned are kept."""
    seen = []

    def zero_embeds_after_step_0(pipeline, step, timestep, tensors):
        seen.append(sorted(tensors))
        return {"embeds": torch.zeros_like(tensors["embeds"])} if step == 0 else {}

    pipe = watched_pipeline()
    state = pipe(
        latents=torch.zeros(1, 2),
        embeds=torch.ones(1, 2),
        callback_on_step_end=zero_embeds_after_step_0,
        callback_on_step_end_tensor_inputs=["latents", "embeds"],
    )
    assert seen == [["embeds", "latents"]] * 3
    assert torch.equal(state.get("latents"), torch.full((1, 2), 4.0))  # 1, then 2 * 1 + 0, 2 * 2 + 0
    assert torch.equal(state.get("embeds"), torch.zeros(1, 2))


def test_a_replaced_latents_is_what_the_next_step_reads():
    """Returning latents replaces them: zeroed after every step, the result is zero latents plus one step."""
    pipe = watched_pipeline()
    out = run(pipe, callback_on_step_end=lambda p, s, t, k: {"latents": torch.zeros_like(k["latents"])})
    assert torch.equal(out, torch.zeros(1, 2))


def test_step_indexes_count_across_the_loops_of_one_call():
    """Two loops of three steps: the callback sees steps 0..5, the timesteps of each loop, and the running
    loop's length as pipeline.num_timesteps."""
    seen = []

    def record(pipeline, step, timestep, tensors):
        seen.append((step, int(timestep), pipeline.num_timesteps))
        return tensors

    pipe = watched_pipeline(loops=2)
    out = run(pipe, callback_on_step_end=record)
    assert seen == [(0, 3, 3), (1, 2, 3), (2, 1, 3), (3, 3, 3), (4, 2, 3), (5, 1, 3)]
    assert torch.equal(out, run(pipe))  # a callback returning what it got changes nothing


@pytest.mark.parametrize("flag", ["interrupt", "_interrupt"])
def test_an_interrupt_in_the_first_loop_runs_no_step_of_the_second(flag):
    """pipeline.interrupt = True (the peer) or pipeline._interrupt = True (the classic callbacks) at step 0:
    no further step of that loop or the next runs; pipe.interrupt says so after the call, and the next call
    resets it."""
    steps = []

    def interrupt(pipeline, step, timestep, tensors):
        steps.append(step)
        setattr(pipeline, flag, True)
        return tensors

    pipe = watched_pipeline(loops=2)
    out = run(pipe, callback_on_step_end=interrupt)
    assert steps == [0]
    assert RAN == ["setup", "step", "setup"]  # the second loop's setup runs, its loop runs no step
    assert torch.equal(out, torch.ones(1, 2))
    assert pipe.interrupt is True and pipe._interrupt is True
    assert torch.equal(run(pipe), torch.full((1, 2), 63.0))  # six steps
    assert pipe.interrupt is False


class ZeroLatents(PipelineCallback):
    tensor_inputs = ["latents"]

    def callback_fn(self, pipeline, step_index, timestep, callback_kwargs):
        return {"latents": torch.zeros_like(callback_kwargs["latents"])}


@pytest.mark.parametrize(
    "callback", [ZeroLatents(), MultiPipelineCallbacks([ZeroLatents(), ZeroLatents()])], ids=["one", "multi"]
)
def test_callback_objects_name_their_own_tensors(callback):
    """A PipelineCallback or MultiPipelineCallbacks gets the tensors it names; the call's
    callback_on_step_end_tensor_inputs is ignored, as the classic pipelines ignore it."""
    pipe = watched_pipeline()
    out = run(pipe, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=["invalid"])
    assert torch.equal(out, torch.zeros(1, 2))


class ChooseLoop(ConditionalPipelineBlocks):
    """Runs the loop named by `which`, a value an earlier block makes: the choice is made at run time."""

    block_classes = [LatentsOnlyLoop]
    block_names = ["latents_only"]
    block_trigger_inputs = ["which"]

    def select_block(self, which=None):
        return which


class PickLoop(ModularPipelineBlocks):
    inputs = [InputParam("embeds", required=True)]

    intermediate_outputs = [OutputParam("which")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.which = "latents_only"
        self.set_block_state(state, block_state)
        return components, state


def test_a_loop_chosen_at_run_time_checks_the_names_when_it_starts():
    """A loop known only once its choice is made is checked when it starts, before its first step."""
    blocks = SequentialPipelineBlocks.from_blocks_dict(
        {"setup": Setup, "pick": PickLoop, "denoise": ChooseLoop}
    )
    pipe = blocks.init_pipeline()
    assert run(pipe, callback_on_step_end=lambda *a: {}).shape == (1, 2)
    RAN.clear()
    with pytest.raises(ValueError, match=r"asks for \['embeds'\], which the denoising loop LatentsOnlyLoop"):
        run(pipe, callback_on_step_end=lambda *a: {}, callback_on_step_end_tensor_inputs=["embeds"])
    assert RAN == ["setup"]


def test_callback_tensor_inputs_lists_what_the_loops_offer():
    """pipe.callback_tensor_inputs: the names every loop of the blocks offers, each once, in order."""
    assert watched_pipeline().callback_tensor_inputs == ["latents", "embeds", "negative_embeds"]
    blocks = SequentialPipelineBlocks.from_blocks_dict(
        {"setup": Setup, "first": LatentsOnlyLoop, "pick": PickLoop, "second": ChooseLoop}
    )
    assert blocks.init_pipeline().callback_tensor_inputs == ["latents"]
