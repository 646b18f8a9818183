"""A step callback for parity tests: it records what each side gives it and does the same to both sides.

`run_both` (tests/blocks/helpers.py) runs the classic pipeline, then ours, on deep copies of one set of
inputs; one `RecordingCallback` serves both runs (it is its own deep copy) and keeps each side's calls apart,
so a test compares what the classic pipeline handed its callback with what ours handed it.
"""

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch
from diffusers import DiffusionPipeline

CLASSIC, OURS = "classic", "ours"

# What a callback may return in place of what it was given: new values by name.
Change = Callable[[dict[str, Any]], dict[str, Any]]


@attrs.frozen
class StepCall:
    """One call of the callback: its step index, timestep, and a copy of every value it was given."""

    step_index: int
    timestep: torch.Tensor
    values: dict[str, Any]


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


@attrs.define(eq=False)
class RecordingCallback:
    """``callback_on_step_end`` that records each call per side and, at chosen steps, changes tensors or sets
    attributes of the pipeline it is handed (the same on both sides).

    Attributes:
        changes: step index -> a function of the given values returning the replacements.
        sets: step index -> attribute -> value, set on the pipeline argument (``_interrupt``,
            ``_guidance_scale``). A classic pipeline's ``interrupt`` is a read-only property its callbacks set
            as ``_interrupt``: on the classic side ``interrupt`` is set as ``_interrupt``.
        calls: per side, the calls in order.
    """

    changes: Mapping[int, Change] = attrs.field(factory=dict)
    sets: Mapping[int, Mapping[str, Any]] = attrs.field(factory=dict)
    calls: dict[str, list[StepCall]] = attrs.field(factory=lambda: {CLASSIC: [], OURS: []})

    def __deepcopy__(self, memo: dict) -> "RecordingCallback":
        return self  # run_both copies its inputs per side; this callback is one for both

    def __call__(self, pipeline, step_index, timestep, callback_kwargs):
        side = CLASSIC if isinstance(pipeline, DiffusionPipeline) else OURS
        values = {name: _copy(value) for name, value in callback_kwargs.items()}
        self.calls[side].append(StepCall(step_index, timestep.clone(), values))
        for name, value in self.sets.get(step_index, {}).items():
            setattr(pipeline, "_interrupt" if side == CLASSIC and name == "interrupt" else name, value)
        change = self.changes.get(step_index)
        return {} if change is None else change(callback_kwargs)

    @property
    def step_indexes(self) -> dict[str, list[int]]:
        return {side: [call.step_index for call in calls] for side, calls in self.calls.items()}


def _assert_same_value(ours: Any, theirs: Any, where: str) -> None:
    if isinstance(theirs, list):
        assert isinstance(ours, list), (
            f"{where}: a list in the classic pipeline, a {type(ours).__name__} in ours"
        )
        assert len(ours) == len(theirs), where
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _assert_same_value(a, b, f"{where}[{k}]")
        return
    assert isinstance(ours, torch.Tensor), where
    assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype), where
    assert torch.equal(ours, theirs), where


def assert_same_calls(callback: RecordingCallback, names: list[str], steps: int) -> None:
    """Both sides called the callback at the same `steps` step indexes (0, 1, ...) and timesteps, with the
    same `names`, each value of the same type, layout, shape, dtype and contents."""
    assert callback.step_indexes == {CLASSIC: list(range(steps)), OURS: list(range(steps))}
    for theirs, ours in zip(callback.calls[CLASSIC], callback.calls[OURS], strict=True):
        assert list(ours.values) == list(theirs.values) == names
        assert ours.timestep.dtype == theirs.timestep.dtype
        assert torch.equal(ours.timestep, theirs.timestep)
        for name in names:
            _assert_same_value(ours.values[name], theirs.values[name], f"step {ours.step_index}: {name}")
