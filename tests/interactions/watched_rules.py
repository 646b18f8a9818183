"""The interaction machine's rules for watched calls: a call cancelled at a drawn step, and a call whose step
callback changes the latents. Both run on the shadow and on the side under test (``InteractionMachine.both``);
the machine's invariants then check that the pipelines, the manager and offload are as after a call that ended
(the next outputs equal the shadow's). Kept apart from tests/interactions/machine.py, which mixes them in."""

from __future__ import annotations

import copy
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from components.model_calls import MODEL_CALLS
from modular import CallCancelled, CancelToken

from .world import OUTPUT, PIPELINES, Side, call_inputs


def _call(side: Side, name: str, steps: int, **watching: Any) -> torch.Tensor:
    """The machine's seeded call of pipeline ``name`` with ``steps`` steps and the watching keywords."""
    pipe = side.pipes[name]
    assert pipe is not None
    inputs = {**call_inputs(pipe, PIPELINES[name]), "num_inference_steps": steps}
    generator = torch.Generator().manual_seed(0)
    return pipe(generator=generator, output=OUTPUT[PIPELINES[name]], **watching, **copy.deepcopy(inputs))


def cancelled_at(side: Side, name: str, steps: int, step: int) -> None:
    """Call ``name``, cancelling it from ``on_progress`` once ``step`` steps are done; it must raise
    CallCancelled before the next step (or, after the loop's last step, before the next block)."""
    token, seen = CancelToken(), {}

    def on_progress(event):
        if event.kind == "step" and event.step == step and not seen:
            seen.update(stage=event.stage, total=event.total)
            token.cancel(f"at step {step}")

    try:
        _call(side, name, steps, cancel=token, on_progress=on_progress)
    except CallCancelled as error:
        assert seen, f"{error} before the step the cancel was set at"
        if step < seen["total"]:
            assert (error.block, error.step, error.total) == (seen["stage"], step, seen["total"]), error
        else:
            assert error.step is None and error.block != seen["stage"], error
        assert error.reason == f"at step {step}"
        raise
    raise AssertionError(f"{name}: a cancel set at step {step} did not stop the call")


def assert_nothing_running(side: Side) -> None:
    """No model of the side counted running by offload or by the model-change tracker."""
    for component_id, model in side.models().items():
        assert MODEL_CALLS.running_count(model) == 0, f"{component_id} still counted running"
    if side.cm.auto_offload_enabled:
        for engine in side.cm.offload_engines:
            assert engine.running_ids() == [], engine.running_ids()


class WatchedCallRules:
    """Rules mixed into ``InteractionMachine`` (which provides ``both``, ``live``, ``main``, ``shadow``)."""

    @precondition(lambda self: self.live())
    @rule(data=st.data(), step=st.integers(1, 2))
    def cancel_a_call_at_a_step(self, data, step):
        """Two steps, cancelled after the first (before the second) or after the last (before the next block)."""
        name = data.draw(st.sampled_from(self.live()), label="pipeline")
        steps = 2
        done = self.both(
            f"{name}(num_inference_steps={steps}, cancel=token set at step {step})",
            lambda side: cancelled_at(side, name, steps, step),
        )
        assert done.error is CallCancelled, done
        assert_nothing_running(self.main)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), factor=st.sampled_from([0.5, 1.5]))
    def call_with_a_latents_callback(self, data, factor):
        name = data.draw(st.sampled_from(self.live()), label="pipeline")

        def scaled_at_step_0(pipeline, step_index, timestep, callback_kwargs):
            return {"latents": callback_kwargs["latents"] * factor} if step_index == 0 else {}

        plain = self.expected_outputs()[name]
        done = self.both(
            f"{name}(callback_on_step_end=latents * {factor} at step 0)",
            lambda side: _call(side, name, 1, callback_on_step_end=scaled_at_step_0),
        )
        assert done.error is None, done
        assert plain.error is not None or not torch.equal(done.value, plain.value), (
            "the callback changed nothing"
        )
        assert_nothing_running(self.main)
