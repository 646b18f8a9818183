"""Watching a call: the step callback's contract (the peer's and diffusers'), interrupt, callback objects, and
what is checked before anything runs, on small hand-written blocks (tests/modular/watched_blocks.py)."""

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

from modular import (
    CallCancelled,
    CancelToken,
    ConditionalPipelineBlocks,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)
from modular.watch.keywords import call_watch_of
from modular.watch.watch import CallWatch

from .watched_blocks import RAN, LatentsOnlyLoop, Setup, StepLoop, run, watched_pipeline


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


def interrupt_then_fail(pipeline, step, timestep, tensors):
    pipeline.interrupt = True
    return None


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
    "returns_offered_name_without_a_value": (
        lambda *a: {"negative_embeds": torch.zeros(1, 2)},
        None,
        ValueError,
        ["setup", "step"],
        r"returned \['negative_embeds'\].*no value",
    ),
    "interrupts_then_returns_none": (
        interrupt_then_fail,
        None,
        TypeError,
        ["setup", "step"],
        "must return a dict",
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
    """pipe.callback_tensor_inputs: the names the blocks' loops offer (those inside a choice too), each once, in
    the order the loops come."""
    assert watched_pipeline().callback_tensor_inputs == ["latents", "embeds", "negative_embeds"]
    blocks = SequentialPipelineBlocks.from_blocks_dict(
        {"setup": Setup, "first": LatentsOnlyLoop, "second": StepLoop}
    )
    assert blocks.init_pipeline().callback_tensor_inputs == ["latents", "embeds", "negative_embeds"]
    chosen = SequentialPipelineBlocks.from_blocks_dict(
        {"setup": Setup, "pick": PickLoop, "denoise": ChooseLoop}
    )
    assert chosen.init_pipeline().callback_tensor_inputs == ["latents"]


# ----- progress events, cancel, threads, and the cost of watching nothing -----


def test_progress_events_name_each_block_and_each_step_in_order():
    """on_progress gets block_started/block_finished for every block (nested names dotted) and a step event
    after every denoising step, counting 1..total in each loop; elapsed seconds never go back."""
    events = []
    blocks = SequentialPipelineBlocks.from_blocks_dict(
        {
            "prep": SequentialPipelineBlocks.from_blocks_dict({"setup": Setup}),
            "denoise": StepLoop,
            "again": Setup,
            "refine": StepLoop,
        }
    )
    pipe = blocks.init_pipeline()
    run(pipe, on_progress=events.append, num_steps=2)
    assert [(e.kind, e.stage, e.step, e.total) for e in events] == [
        ("block_started", "prep.setup", None, None),
        ("block_finished", "prep.setup", None, None),
        ("block_started", "denoise", None, None),
        ("step", "denoise", 1, 2),
        ("step", "denoise", 2, 2),
        ("block_finished", "denoise", None, None),
        ("block_started", "again", None, None),
        ("block_finished", "again", None, None),
        ("block_started", "refine", None, None),
        ("step", "refine", 1, 2),
        ("step", "refine", 2, 2),
        ("block_finished", "refine", None, None),
    ]
    elapsed = [event.elapsed for event in events]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0


@pytest.mark.parametrize("at", ["block_started", "step"])
def test_an_on_progress_that_raises_stops_the_call_and_leaves_the_pipeline_clean(at):
    """An exception from on_progress propagates as it is (at the first block, or after the first step) and the
    next call runs as a fresh one."""
    pipe = watched_pipeline()
    fresh = run(pipe)
    RAN.clear()

    def fails(event):
        if event.kind == at:
            raise RuntimeError("the app's progress handler failed")

    with pytest.raises(RuntimeError, match="the app's progress handler failed"):
        run(pipe, on_progress=fails)
    assert RAN == ([] if at == "block_started" else ["setup", "step"])
    assert pipe.interrupt is False and keeps_no_callback(pipe)
    assert torch.equal(run(pipe), fresh)


@pytest.mark.parametrize("make_cancel", [CancelToken, threading.Event], ids=["token", "event"])
def test_a_cancel_raises_call_cancelled_naming_the_block_and_step_and_pickles(make_cancel):
    """A cancel set after step 1 stops the call before step 2: CallCancelled (a RuntimeError) names the block
    and the step, survives pickling (a call in another process reports it), and the next call is a fresh one."""
    cancel = make_cancel()

    def cancel_after_step_1(event):
        if event.kind == "step":
            cancel.set() if isinstance(cancel, threading.Event) else cancel.cancel("the user closed the tab")

    pipe = watched_pipeline()
    with pytest.raises(CallCancelled) as caught:
        run(pipe, cancel=cancel, on_progress=cancel_after_step_1)
    error = caught.value
    assert isinstance(error, RuntimeError)
    assert (error.block, error.step, error.total) == ("denoise_0", 1, 3)
    assert str(error).startswith("the call was cancelled before step 2 of 3 of block 'denoise_0'")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is CallCancelled and str(again) == str(error)
    assert (again.block, again.step, again.total, again.reason) == (error.block, 1, 3, error.reason)
    assert torch.equal(run(pipe), torch.full((1, 2), 7.0))


def test_two_threads_on_one_pipeline_each_have_their_own_interrupt():
    """Two calls of one pipeline at once: the one whose callback interrupts stops after its first step; the
    other, at the same step at the same time, runs all of its steps."""
    pipe = watched_pipeline()
    both_at_step_0 = threading.Barrier(2, timeout=30)

    def interrupts(pipeline, step, timestep, tensors):
        pipeline.interrupt = True
        both_at_step_0.wait()
        return tensors

    def waits(pipeline, step, timestep, tensors):
        if step == 0:
            both_at_step_0.wait()
        return tensors

    with ThreadPoolExecutor(2) as pool:
        stopped = pool.submit(run, pipe, callback_on_step_end=interrupts)
        full = pool.submit(run, pipe, callback_on_step_end=waits)
        assert torch.equal(stopped.result(timeout=60), torch.ones(1, 2))
        assert torch.equal(full.result(timeout=60), torch.full((1, 2), 7.0))


class SeesTheWatch(ModularPipelineBlocks):
    """Records what the call handed its blocks as the watch."""

    seen: list = []

    intermediate_outputs = [OutputParam("done")]

    def __call__(self, components, state):
        SeesTheWatch.seen.append(components.__dict__.get("_call_watch", "no such field"))
        block_state = self.get_block_state(state)
        block_state.done = True
        self.set_block_state(state, block_state)
        return components, state


def test_a_call_with_no_watching_keyword_makes_no_watch():
    """No callback, cancel, progress or preview keyword: no CallWatch is made (watching costs nothing), and
    with one the blocks see it."""
    assert call_watch_of() is None
    pipe = SeesTheWatch().init_pipeline()
    SeesTheWatch.seen = []
    pipe(output="done")
    pipe(output="done", on_progress=lambda event: None)
    assert SeesTheWatch.seen[0] is None
    assert isinstance(SeesTheWatch.seen[1], CallWatch)
