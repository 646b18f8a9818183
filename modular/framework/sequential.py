"""Blocks that run their children one after another."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from modular.framework.block import ModularPipelineBlocks
from modular.framework.composite import CompositeBlocks
from modular.framework.composition import sequential_inputs, spec_problems, wiring_problems
from modular.framework.params import InputParam
from modular.framework.steps import Known, Step

__all__ = ["SequentialPipelineBlocks", "blocks_of_steps"]


class SequentialPipelineBlocks(CompositeBlocks):
    """Children run in order; each sees what earlier ones wrote to the state."""

    def _problems(self) -> list[str]:
        children = self._children()
        return spec_problems(children) + wiring_problems(children)

    @property
    def inputs(self) -> list[InputParam]:
        return sequential_inputs(self._children())

    def execution_steps(
        self, given: Known | Mapping[str, Any] | Iterable[str], path: tuple[str, ...] = ()
    ) -> list[Step]:
        """Each child's steps, in order; a child sees what the steps before it produce."""
        known = Known.of(given)
        steps: list[Step] = []
        for name, child in self._sub_blocks.items():
            steps += child.execution_steps(known, (*path, name))
        return steps

    def get_execution_blocks(self, **inputs: Any) -> SequentialPipelineBlocks:
        """The blocks that would run for these inputs, flattened into one sequence."""
        return blocks_of_steps(self.execution_steps(inputs), self.description)


def blocks_of_steps(steps: Sequence[Step], description: str = "") -> SequentialPipelineBlocks:
    """The steps' blocks as one flat sequence, named as in their parents (a repeated name gets ``_2``, ...)."""
    named: dict[str, ModularPipelineBlocks] = {}
    for step in steps:
        key = step.name
        suffix = 2
        while key in named:
            key = f"{step.name}_{suffix}"
            suffix += 1
        named[key] = step.block
    result = SequentialPipelineBlocks.from_blocks_dict(named, description=description)
    result._workflow_map = None
    return result
