"""The watch of one pipeline call: step callbacks, the interrupt flag, cancel, progress events, previews.

A call given none of ``callback_on_step_end``, ``cancel``, ``on_progress`` or ``on_preview`` makes no
:class:`CallWatch`, and the blocks pay one attribute read per block and per step for the feature. Given any of
them, the call makes one watch (its own: two calls in two threads never share one) and hands it to its blocks
through the call's view of the pipeline (``components._call_watch``):

- ``run_steps`` tells it before and after every top-level block (progress events; cancel is checked before);
- a denoising loop tells it when it starts (the tensors the callback asks for are checked against the loop's
  own), before every step (cancel raises :class:`CallCancelled`; the interrupt flag ends the loop) and after
  every step (the step callback, then a preview, then a progress event).

The step callback follows diffusers' contract (``callback(pipeline, step_index, timestep, callback_kwargs) ->
dict``; ``PipelineCallback`` and ``MultiPipelineCallbacks`` objects name their own tensors), with the peer's
additions: step indexes count across every loop of the call, and a callback's result is checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from modular.errors import CallCancelled, PreviewUnavailableError
from modular.watch.events import Cancellable, Preview, ProgressEvent

__all__ = ["DEFAULT_TENSOR_INPUTS", "CallWatch", "loops_of", "watch_of"]

#: What a callback gets when the call names no tensors: the classic pipelines' default.
DEFAULT_TENSOR_INPUTS = ("latents",)


@attrs.define(eq=False)
class CallWatch:
    """What one call was asked to report and obey, and where it is (see the module docstring).

    Attributes:
        callback: ``callback_on_step_end``, or ``None``.
        tensor_inputs: the names the callback gets in ``callback_kwargs``.
        tensor_inputs_given: whether the caller (or a callback object) named them (checked even without a
            callback, as diffusers checks them).
        cancel: an object whose ``is_set()`` says the call is cancelled, or ``None``.
        on_progress: called with each :class:`ProgressEvent`, or ``None``.
        preview_every: a preview every that many steps, or ``None``.
        on_preview: called with each :class:`Preview`, or ``None``.
        preview_decoder: the model previews decode with, or ``None`` (the family's latent-to-RGB map).
        interrupted: set by a callback (``pipeline.interrupt = True`` or ``pipeline._interrupt = True``): the
            loop that runs ends, and every loop after it runs no step.
        step_index: the steps done in this call, across its loops (the callback's ``step_index``).
        num_timesteps: the running loop's number of steps (``pipeline.num_timesteps`` in a callback).
        guidance_scale: set by a callback (``pipeline._guidance_scale = 0.0``, as diffusers' CFG cutoff
            callbacks do): the guidance scale of the call's remaining steps; ``None`` while unset.
    """

    callback: Callable[..., Any] | None = None
    tensor_inputs: tuple[str, ...] = DEFAULT_TENSOR_INPUTS
    tensor_inputs_given: bool = False
    cancel: Cancellable | None = None
    on_progress: Callable[[ProgressEvent], Any] | None = None
    preview_every: int | None = None
    on_preview: Callable[[Preview], Any] | None = None
    preview_decoder: Any = None
    interrupted: bool = False
    step_index: int = 0
    num_timesteps: int | None = None
    guidance_scale: float | None = None
    started: float = attrs.field(factory=time.perf_counter)
    _stage: str = ""
    _loop_step: int = 0
    _offered: list[str] = attrs.field(factory=list)  # the running loop's callback_tensor_inputs

    # ----- before the run -----
    def check_loops(self, loops: Iterable[Any]) -> None:
        """Checks, before any block runs, that every loop the call is known to run offers what is asked of it.

        Raises:
            ValueError: a tensor the callback asks for that a loop does not offer; a preview asked of a loop
                that cannot make one.
        """
        for loop in loops:
            self._check_loop(loop)

    def _check_loop(self, loop: Any) -> None:
        if self.callback is not None or self.tensor_inputs_given:
            offered = self._offered = list(loop.callback_tensor_inputs)
            missing = [name for name in self.tensor_inputs if name not in offered]
            if missing:
                msg = (
                    f"callback_on_step_end_tensor_inputs asks for {missing}, which the denoising loop "
                    f"{type(loop).__name__} does not offer; it offers {offered}"
                )
                raise ValueError(msg)
        if self.on_preview is not None and not loop.offers_previews(self.preview_decoder):
            msg = f"on_preview: the denoising loop {type(loop).__name__} cannot make previews" + (
                " with this preview_decoder"
                if self.preview_decoder is not None
                else " (its family has no latent-to-RGB map); pass preview_decoder="
            )
            raise PreviewUnavailableError(msg)

    # ----- around blocks -----
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def check_cancel(self, stage: str, step: int | None = None, total: int | None = None) -> None:
        """Raises :class:`CallCancelled` when the call's cancel is set."""
        if self.cancel is not None and self.cancel.is_set():
            raise CallCancelled(stage, step, total, getattr(self.cancel, "reason", None))

    def block_started(self, stage: str) -> None:
        self.check_cancel(stage)
        self._stage = stage
        self._report("block_started", stage)

    def block_finished(self, stage: str) -> None:
        self._report("block_finished", stage)

    def _report(self, kind: str, stage: str, step: int | None = None, total: int | None = None) -> None:
        if self.on_progress is not None:
            self.on_progress(ProgressEvent(kind, stage, step, total, self.elapsed()))

    # ----- in a denoising loop -----
    def loop_started(self, loop: Any, total: int, block_state: Any = None) -> None:
        """A loop starts: its own offers are checked (a loop chosen only at run time was not checked before),
        and, given its ``block_state``, that it has a value for every name the callback asks for, so that a
        name it offers but has no value for in this call fails before its first step, not after it.

        Raises:
            ValueError: a name the loop does not offer, or has no value for.
        """
        self._check_loop(loop)
        if self.callback is not None and block_state is not None:
            missing = loop.missing_callback_values(block_state, self.tensor_inputs)
            if missing:
                msg = (
                    f"callback_on_step_end_tensor_inputs asks for {missing}, which the denoising loop "
                    f"{type(loop).__name__} offers but has no value for in this call (an optional input not "
                    f"given?); ask for others of {self._offered}"
                )
                raise ValueError(msg)
        self.num_timesteps = total
        self._loop_step = 0

    def stops_before_step(self, step: int) -> bool:
        """Whether the loop stops before step ``step`` (0-based): cancel raises, the interrupt flag ends it."""
        self.check_cancel(self._stage, step, self.num_timesteps)
        return self.interrupted

    def step_finished(self, loop: Any, components: Any, block_state: Any, timestep: Any) -> None:
        """After one step: the callback (which may replace tensors or set the interrupt flag), a preview when
        one is due, and a progress event."""
        if self.callback is not None:
            self._run_callback(loop, components, block_state, timestep)
        self.step_index += 1
        self._loop_step += 1
        total = self.num_timesteps
        if self.on_preview is not None and self.preview_every is not None:
            if self._loop_step % self.preview_every == 0:
                images = loop.preview_images(components, block_state, self.preview_decoder)
                self.on_preview(Preview(images, self._loop_step, total or 0, self._stage, self.elapsed()))
        self._report("step", self._stage, self._loop_step, total)

    def _run_callback(self, loop: Any, components: Any, block_state: Any, timestep: Any) -> None:
        given = loop.callback_values(components, block_state, self.tensor_inputs)
        assert self.callback is not None
        updates = self.callback(components, self.step_index, timestep, given)
        if not isinstance(updates, dict):
            msg = (
                f"callback_on_step_end must return a dict of the tensors it replaces (its callback_kwargs, or "
                f"{{}}), got {type(updates).__name__}"
            )
            raise TypeError(msg)
        offered = self._offered  # read once, as the loop started (it walks the loop's blocks)
        unknown = [name for name in updates if name not in offered]
        if unknown:
            msg = (
                f"callback_on_step_end returned {unknown}, which the denoising loop {type(loop).__name__} does "
                f"not offer; it may return {offered}"
            )
            raise ValueError(msg)
        missing = loop.missing_callback_values(block_state, list(updates))
        if missing:
            msg = (
                f"callback_on_step_end returned {missing}, which the denoising loop {type(loop).__name__} offers "
                f"but has no value for in this call, so no step reads it; return only names it has values for"
            )
            raise ValueError(msg)
        if updates:
            loop.take_callback_values(components, block_state, updates)


def loops_of(steps: Sequence[Any]) -> list[Any]:
    """The loop blocks among a plan's steps (nested bodies included), in order."""
    from modular.framework.steps import StepKind

    found: list[Any] = []
    for step in steps:
        if step.kind is StepKind.LOOP:
            found.append(step.block)
        found += loops_of(step.body)
    return found


def watch_of(components: Any) -> CallWatch | None:
    """The watch of the call whose view ``components`` is, or ``None`` (no call watch, or blocks run bare)."""
    try:
        return components.__dict__.get("_call_watch")
    except AttributeError:
        return None
