"""Cancel from outside: ``pipe(..., cancel=event)`` set by another thread while a step or the text encoder runs,
before the call, or by a thread on another pipeline sharing the models; with and without auto offload (evictions
at every change of model, a host budget, a streamed UNet). The call raises ``CallCancelled`` within one step,
and leaves nothing behind: nothing running, the engine's ledger consistent, the next output as a fresh one.

No sleeps: the tests know where a call is from a forward pre-hook that holds it (tests/modular/watched_calls.py)
or from its progress events, and every wait is bounded."""

import threading

import pytest
import torch

from modular import CallCancelled, CancelToken, ComponentsManager

from .tiny_sd import tiny_sd_pipeline
from .watched_calls import (
    AFTER_TEXT_ENCODER,
    FIRST_BLOCK,
    LOOP,
    WAIT,
    ForwardGate,
    assert_left_clean,
    call_in_thread,
    joined,
    offload_on,
    run,
)

TIMESTEPS = 4  # of the STEPS=3 calls (PNDM)


def _loaded(repo, mode, tmp_path):
    """A pipeline, its plain output (before any offload), and the manager set to ``mode``."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repo, cm)
    expected = run(pipe)
    offload_on(cm, pipe, mode, tmp_path)
    return cm, pipe, expected


@pytest.mark.parametrize("mode", ["plain", "offload", "host", "stream"])
def test_a_cancel_set_from_another_thread_during_step_k_stops_the_call_before_step_k_plus_1(
    repo, tmp_path, mode
):
    """Set while the UNet's forward of step 1 runs: CallCancelled names the loop and step 2 (0-based) with the
    token's reason; no UNet forward ran after it; nothing is left running and the next call equals the first."""
    cm, pipe, expected = _loaded(repo, mode, tmp_path)
    k = 1
    gate = ForwardGate(pipe.unet, at=k + 1)  # the UNet runs once per step: its (k+1)-th forward is step k
    token = CancelToken()
    thread, outcome = call_in_thread(lambda: run(pipe, cancel=token), gate)
    assert gate.inside.wait(WAIT)
    token.cancel("the user left")
    gate.release.set()
    joined(thread)
    gate.remove()
    error = outcome.get("error")
    assert isinstance(error, CallCancelled), outcome
    assert (error.block, error.step, error.total, error.reason) == (LOOP, k + 1, TIMESTEPS, "the user left")
    assert str(error) == f"the call was cancelled before step 3 of 4 of block '{LOOP}': the user left"
    assert gate.forwards == k + 1
    if mode != "plain":
        reasons = {entry.reason.split(":")[0] for entry in cm.offload_log}
        assert ("stream" if mode == "stream" else "evict") in reasons  # the call made room as it went
    assert_left_clean(cm, pipe)
    assert torch.equal(run(pipe), expected)
    assert_left_clean(cm, pipe)


@pytest.mark.parametrize("mode", ["plain", "offload"])
def test_a_cancel_set_while_the_text_encoder_runs_stops_the_call_before_the_next_block(repo, tmp_path, mode):
    """A threading.Event set during the text encoder's first forward: the encoding block ends, and the call
    raises before the block after it; the UNet never ran (nor was it placed), and the next call equals the first."""
    cm, pipe, expected = _loaded(repo, mode, tmp_path)
    gate, unet = ForwardGate(pipe.text_encoder, at=1), ForwardGate(pipe.unet, at=0)
    event = threading.Event()
    thread, outcome = call_in_thread(lambda: run(pipe, cancel=event), gate, unet)
    assert gate.inside.wait(WAIT)
    event.set()
    gate.release.set()
    joined(thread)
    gate.remove()
    unet.remove()
    error = outcome.get("error")
    assert isinstance(error, CallCancelled), outcome
    assert (error.block, error.step, error.total, error.reason) == (AFTER_TEXT_ENCODER, None, None, None)
    assert str(error) == f"the call was cancelled before block '{AFTER_TEXT_ENCODER}'"
    assert gate.forwards == 2  # the prompt and the negative prompt: the block ran to its end
    assert unet.forwards == 0
    if mode != "plain":
        unet_id = cm.get_id(pipe.unet)
        assert [entry for entry in cm.offload_log if entry.model_id == unet_id] == []
    assert_left_clean(cm, pipe)
    assert torch.equal(run(pipe), expected)


@pytest.mark.parametrize("mode", ["plain", "offload"])
@pytest.mark.parametrize("kind", ["CancelToken", "threading.Event"])
def test_a_cancel_set_before_the_call_raises_before_the_first_block_and_nothing_runs(
    repo, tmp_path, mode, kind
):
    """Already set: CallCancelled names the first block; no model ran or moved (the decision log is empty)."""
    cm, pipe, expected = _loaded(repo, mode, tmp_path)
    cancel = CancelToken() if kind == "CancelToken" else threading.Event()
    cancel.cancel() if isinstance(cancel, CancelToken) else cancel.set()
    counters = [ForwardGate(pipe.text_encoder, at=0), ForwardGate(pipe.unet, at=0)]
    for counter in counters:
        counter.target_thread = threading.get_ident()
    with pytest.raises(CallCancelled, match=f"cancelled before block '{FIRST_BLOCK}'$") as raised:
        run(pipe, cancel=cancel)
    assert (raised.value.block, raised.value.step) == (FIRST_BLOCK, None)
    assert [counter.forwards for counter in counters] == [0, 0]
    for counter in counters:
        counter.remove()
    if mode != "plain":
        assert len(cm.offload_log) == 0
    assert_left_clean(cm, pipe)
    assert torch.equal(run(pipe), expected)


@pytest.mark.parametrize("mode", ["plain", "offload"])
def test_a_cancel_without_is_set_is_a_type_error_before_anything_runs(repo, tmp_path, mode):
    """``cancel=True`` (not an Event): TypeError naming what to pass, before any model runs or moves."""
    cm, pipe, expected = _loaded(repo, mode, tmp_path)
    counter = ForwardGate(pipe.text_encoder, at=0)
    counter.target_thread = threading.get_ident()
    with pytest.raises(
        TypeError, match=r"cancel must be a threading.Event or a modular.CancelToken .*got a bool"
    ):
        run(pipe, cancel=True)
    assert counter.forwards == 0
    counter.remove()
    if mode != "plain":
        assert len(cm.offload_log) == 0
    assert_left_clean(cm, pipe)
    assert torch.equal(run(pipe), expected)


@pytest.mark.parametrize("mode", ["plain", "offload"])
def test_two_threads_on_shared_models_one_cancelled_mid_loop_the_other_unchanged(repo, tmp_path, mode):
    """Pipelines A and B on one manager share every model. A waits inside its step 1; B starts, and at its own
    step 1 cancels A and lets it go: both then run at once. A raises before its step 2; B's images equal B's
    solo run; afterwards nothing runs and A's next call equals its solo run."""
    cm = ComponentsManager()
    pipe_a, pipe_b = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    assert pipe_a.unet is pipe_b.unet and pipe_a.text_encoder is pipe_b.text_encoder
    solo_a, solo_b = run(pipe_a, seed=0), run(pipe_b, seed=1)
    offload_on(cm, pipe_a, mode, tmp_path)
    gate = ForwardGate(pipe_a.unet, at=2)
    token = CancelToken()

    def cancel_a(event):  # in B's thread, at B's first step done
        if event.kind == "step" and event.step == 1:
            token.cancel("B's user cancelled A")
            gate.release.set()

    thread_a, outcome_a = call_in_thread(lambda: run(pipe_a, seed=0, cancel=token), gate)
    assert gate.inside.wait(WAIT)
    thread_b, outcome_b = call_in_thread(lambda: run(pipe_b, seed=1, on_progress=cancel_a))
    joined(thread_a)
    joined(thread_b)
    gate.remove()
    error = outcome_a.get("error")
    assert isinstance(error, CallCancelled), outcome_a
    assert (error.block, error.step) == (LOOP, 2)
    assert "error" not in outcome_b, outcome_b
    assert torch.equal(outcome_b["result"], solo_b)
    assert_left_clean(cm, pipe_a, pipe_b)
    assert torch.equal(run(pipe_a, seed=0), solo_a)
    assert torch.equal(run(pipe_b, seed=1), solo_b)


def test_a_job_runner_passes_its_cancel_to_every_jobs_call(repo):
    """``JobRunner(cancel=token)``: the first job runs to its end; cancelled from its result, the second job's
    call raises CallCancelled before its first block, and nothing runs after it. A cancel without is_set is a
    TypeError when the runner is made."""
    from modular.batch.jobs import Job, JobRunner

    inputs = {"prompt": "a cat", "num_inference_steps": 1, "height": 32, "width": 32}
    jobs = [Job(name=name, repo=str(repo), inputs=inputs) for name in ("first", "second", "third")]
    token = CancelToken()
    runner = JobRunner(ComponentsManager(), progress=False, cancel=token)
    results = runner.run(jobs)
    first = next(results)
    assert first.job.name == "first" and first.images.shape == (1, 32, 32, 3)
    token.cancel("stop the batch")
    with pytest.raises(CallCancelled, match=f"before block '{FIRST_BLOCK}': stop the batch"):
        next(results)
    with pytest.raises(StopIteration):
        next(results)
    with pytest.raises(TypeError, match="cancel must be a threading.Event"):
        JobRunner(ComponentsManager(), cancel="stop")


@pytest.mark.parametrize("mode", ["offload", "stream"])
def test_step_callbacks_and_previews_run_between_forwards_and_see_the_models_as_the_call_left_them(
    repo, tmp_path, mode
):
    """Under auto offload a step callback and a preview run between forwards: no model is running then, the
    UNet is resident as its step left it (streamed: its resident part), nothing moves while they run, and the
    output equals the call without them."""
    cm, pipe, expected = _loaded(repo, mode, tmp_path)
    engine = cm.offload_engine
    unet_id = cm.get_id(pipe.unet)
    seen = []

    def look(what):
        seen.append((what, engine.running_ids(), engine.is_resident(unet_id), len(cm.offload_log)))

    def callback(pipeline, step, timestep, callback_kwargs):
        look("callback")
        return {}

    images = run(pipe, callback_on_step_end=callback, on_preview=lambda preview: look("preview"))
    assert torch.equal(images, expected)
    assert [what for what, *_ in seen] == ["callback", "preview"] * (len(seen) // 2) and seen
    for k in range(0, len(seen), 2):
        (_, running, resident, log_size), (_, running_2, resident_2, log_size_2) = seen[k], seen[k + 1]
        assert running == running_2 == []
        assert resident and resident_2  # the UNet stays where its step left it (streamed: its resident part)
        assert log_size == log_size_2  # the callback and the preview moved nothing
    assert_left_clean(cm, pipe)
