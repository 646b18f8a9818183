"""Blocks whose children run once per iteration on one shared block state (the denoising loop)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tqdm.auto import tqdm

from components import ComponentSpec, ConfigSpec
from modular.framework.composite import CompositeBlocks, run_child
from modular.framework.composition import (
    merge_components,
    merge_configs,
    merge_outputs,
    sequential_inputs,
    spec_problems,
    wiring_problems,
)
from modular.framework.params import InputParam, OutputParam
from modular.framework.state import BlockState, PipelineState
from modular.framework.steps import Known, Step, StepKind
from modular.logging import is_progress_bar_enabled

__all__ = ["LoopSequentialPipelineBlocks"]


class LoopSequentialPipelineBlocks(CompositeBlocks):
    """A loop: the family writes ``__call__`` (what to iterate), the children run each iteration.

    Children are called as ``child(components, block_state, **loop_kwargs)`` and return
    ``(components, block_state)``; they share the loop's block state, so what one writes the next reads.
    """

    @property
    def loop_expected_components(self) -> list[ComponentSpec]:
        return []

    @property
    def loop_expected_configs(self) -> list[ConfigSpec]:
        return []

    @property
    def loop_inputs(self) -> list[InputParam]:
        return []

    @property
    def loop_intermediate_outputs(self) -> list[OutputParam]:
        return []

    def _problems(self) -> list[str]:
        children = self._children()
        # Iterations feed back into each other, so "produced only later" is fine inside a loop.
        return spec_problems(children) + wiring_problems(children, check_order=False)

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return merge_components(self._children(), self.loop_expected_components)

    @property
    def expected_configs(self) -> list[ConfigSpec]:
        return merge_configs(self._children(), self.loop_expected_configs)

    @property
    def inputs(self) -> list[InputParam]:
        return sequential_inputs(self._children(), self.loop_inputs)

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return merge_outputs(self._children(), self.loop_intermediate_outputs)

    def execution_steps(
        self, given: Known | Mapping[str, Any] | Iterable[str], path: tuple[str, ...] = ()
    ) -> list[Step]:
        """One loop step: its own components, and as its body every child's steps (each iteration runs them).

        What any iteration produces counts as produced for the whole body: later iterations read it.
        """
        known = Known.of(given)
        known.produced.update(self.intermediate_output_names)
        body: list[Step] = []
        for name, child in self._sub_blocks.items():
            body += child.execution_steps(known, (*path, name))
        return [Step(self, path, StepKind.LOOP, uses=tuple(self.loop_expected_components), body=tuple(body))]

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        # Not the composite run: a loop's walk lists the loop itself, whose __call__ the family writes.
        msg = f"{type(self).__name__} must implement __call__(self, components, state): what to iterate over"
        raise NotImplementedError(msg)

    def loop_step(
        self, components: Any, block_state: BlockState, **loop_kwargs: Any
    ) -> tuple[Any, BlockState]:
        """One iteration: every child, in order, on the shared block state."""
        for name, block in self._sub_blocks.items():
            components, block_state = run_child(name, block, components, block_state, **loop_kwargs)
        return components, block_state

    # ----- what a call's watch asks of a loop (modular/watch/watch.py) -----
    def callback_values(
        self, components: Any, block_state: BlockState, names: Iterable[str]
    ) -> dict[str, Any]:
        """The ``callback_kwargs`` a step callback gets: each named value of the block state. A family whose
        classic pipeline holds a value in another layout (classifier-free guidance's doubled batch) overrides
        this and :meth:`take_callback_values` together."""
        values = block_state.__dict__
        missing = [name for name in names if name not in values]
        if missing:
            msg = (
                f"{type(self).__name__}: the step callback asks for {missing}, which this call's loop has no "
                f"value for (an optional input not given?); it has {sorted(values)}"
            )
            raise ValueError(msg)
        return {name: values[name] for name in names}

    def missing_callback_values(self, block_state: BlockState, names: Iterable[str]) -> list[str]:
        """The ``names`` this loop will have no value for when its steps call the step callback, checked as it
        starts: neither in its block state nor made by its own blocks. A loop that overrides
        :meth:`callback_values` (values kept in another layout) overrides this too; until it does, none is
        reported here and its :meth:`callback_values` reports them at the first step."""
        if type(self).callback_values is not LoopSequentialPipelineBlocks.callback_values:
            return []
        values = block_state.__dict__
        made = set(self.intermediate_output_names)
        return [name for name in names if name not in values and name not in made]

    def take_callback_values(
        self, components: Any, block_state: BlockState, updates: Mapping[str, Any]
    ) -> None:
        """Puts the values a step callback returned into the block state, also where a group of inputs
        (``kwargs_type``, e.g. ``denoiser_input_fields``) holds the same value."""
        values = block_state.__dict__
        for name, value in updates.items():
            old = values.get(name)
            values[name] = value
            for group in values.values():
                if isinstance(group, dict) and name in group and group[name] is old:
                    group[name] = value

    def offers_previews(self, decoder: Any = None) -> bool:
        """Whether :meth:`preview_images` can make previews (with ``decoder``, or by the family's own map)."""
        return False

    def preview_images(self, components: Any, block_state: BlockState, decoder: Any = None) -> list[Any]:
        """RGB images (``PIL.Image.Image``, one per image of the batch) of the current latents."""
        msg = f"{type(self).__name__} cannot make previews"
        raise NotImplementedError(msg)

    def check_previews(self, components: Any, decoder: Any = None) -> None:
        """Before the run, with the pipeline's components: raises ValueError when :meth:`preview_images` could
        not read this call's latents (a map or ``decoder`` of another latent space). Default: nothing to check."""

    def progress_bar(self, iterable: Any = None, total: int | None = None) -> tqdm:
        """A progress bar configured by :meth:`set_progress_bar_config` (``disable=True`` hides it;
        ``tqdm_class=...`` makes it of another class taking tqdm's arguments, as in ``tqdm.contrib``)."""
        config = dict(getattr(self, "_progress_bar_config", {}))
        if iterable is None and total is None:
            msg = "progress_bar needs an iterable or a total"
            raise ValueError(msg)
        if "disable" not in config:  # the project's switch (modular.logging.disable_progress_bar)
            config["disable"] = not is_progress_bar_enabled()
        bar_class = config.pop("tqdm_class", tqdm)
        return bar_class(iterable, total=total, **config)

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """Configure this loop's bar and those of any loops nested in it."""
        self._progress_bar_config = dict(kwargs)
        super().set_progress_bar_config(**kwargs)
