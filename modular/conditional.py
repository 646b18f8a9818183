"""Blocks that run one of their children, chosen by the inputs present."""

from __future__ import annotations

from typing import Any

import attrs

from .block import PRODUCED, ModularPipelineBlocks
from .composition import branch_inputs, spec_problems
from .params import InputParam
from .sequential import CompositeBlocks, run_child
from .state import PipelineState

__all__ = ["ConditionalPipelineBlocks", "AutoPipelineBlocks"]


class ConditionalPipelineBlocks(CompositeBlocks):
    """Runs the child that :meth:`select_block` names, or nothing when it returns ``None``.

    ``block_trigger_inputs`` lists the inputs whose values are passed to ``select_block``.
    """

    block_trigger_inputs: list[str | None] = []
    default_block_name: str | None = None

    @property
    def trigger_inputs(self) -> list[str]:
        return [t for t in self.block_trigger_inputs if t is not None]

    def select_block(self, **trigger_values: Any) -> str | None:
        """The name of the child to run for these trigger values (``None``: run nothing)."""
        return self.default_block_name

    def _select(self, values: dict[str, Any]) -> str | None:
        name = self.select_block(**{t: values.get(t) for t in self.trigger_inputs})
        if name is not None and name not in self._sub_blocks:
            msg = (
                f"{type(self).__name__}.select_block returned {name!r}, which is not a sub-block; "
                f"sub-blocks are: {list(self._sub_blocks)}"
            )
            raise KeyError(msg)
        return name

    def _can_skip(self) -> bool:
        """Whether no child may run (then none of the children's inputs is required)."""
        return self.default_block_name is None

    def _decides_on_values(self) -> bool:
        """Whether select_block looks at trigger values (not only at which are present)."""
        return True

    @property
    def inputs(self) -> list[InputParam]:
        params = branch_inputs(self._children())
        if self._can_skip():
            params = [attrs.evolve(p, required=False) if p.required else p for p in params]
        known = {p.name for p in params}
        # Trigger inputs are inputs too: they choose the branch.
        extra = [
            InputParam(t, description=f"Selects a branch of {type(self).__name__}.")
            for t in self.trigger_inputs
            if t not in known
        ]
        return params + extra

    def _problems(self) -> list[str]:
        return spec_problems(self._children())

    def _leaf_blocks(self, active: dict[str, Any], prefix: str, into: list) -> None:
        if self._decides_on_values() and any(active.get(t) is PRODUCED for t in self.trigger_inputs):
            # The choice depends on a value no block has made yet: it is made at run time, so the plan
            # keeps this block whole (it may produce any branch's outputs).
            ModularPipelineBlocks._leaf_blocks(self, active, prefix, into)
            return
        name = self._select(active)
        if name is not None:
            self._sub_blocks[name]._leaf_blocks(active, name, into)

    def get_execution_blocks(self, **inputs: Any) -> ModularPipelineBlocks | None:
        name = self._select({k: v for k, v in inputs.items() if v is not None})
        if name is None:
            return None
        return self._sub_blocks[name].get_execution_blocks(**inputs)

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        name = self._select(state.values)
        if name is None:
            return components, state
        return run_child(name, self._sub_blocks[name], components, state)


class AutoPipelineBlocks(ConditionalPipelineBlocks):
    """Picks the first child whose trigger input is present; the child whose trigger is ``None`` is the default.

    ``block_trigger_inputs`` has one entry per child, in priority order.
    """

    def _problems(self) -> list[str]:
        problems = super()._problems()
        triggers = list(self.block_trigger_inputs)
        if len(triggers) != len(self._sub_blocks):
            problems.append(
                f"block_trigger_inputs has {len(triggers)} entries for {len(self._sub_blocks)} sub-blocks "
                f"({list(self._sub_blocks)}); give one trigger (or None for the default) per sub-block"
            )
        if triggers.count(None) > 1:
            problems.append(
                "more than one sub-block has the trigger None; only one default branch is allowed"
            )
        return problems

    def select_block(self, **trigger_values: Any) -> str | None:
        default = None
        for trigger, name in zip(self.block_trigger_inputs, self._sub_blocks):
            if trigger is None:
                default = name
            elif trigger_values.get(trigger) is not None:
                return name
        return default

    def _can_skip(self) -> bool:
        return None not in self.block_trigger_inputs

    def _decides_on_values(self) -> bool:
        # The stock rule looks at presence only; a subclass with its own select_block may look at values.
        return type(self).select_block is not AutoPipelineBlocks.select_block
