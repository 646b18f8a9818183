"""Blocks that run one of their children, chosen by the inputs present (or by their values)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from modular.framework.block import ModularPipelineBlocks
from modular.framework.composite import CompositeBlocks
from modular.framework.composition import branch_inputs, spec_problems
from modular.framework.params import InputParam
from modular.framework.sequential import blocks_of_steps
from modular.framework.steps import AT_RUN_TIME, Known, Step, StepKind, Undecided

__all__ = ["ConditionalPipelineBlocks", "AutoPipelineBlocks"]


class ConditionalPipelineBlocks(CompositeBlocks):
    """Runs the child that :meth:`select_block` names; when it returns ``None``, the ``default_block_name``
    child, or nothing when there is no default (the peer's rule).

    ``block_trigger_inputs`` lists the inputs whose values are passed to ``select_block``. The choice is
    made before the run when the trigger values are known then (given by the caller); when one is made
    by an earlier block, it is made at run time, on the value in the state.
    """

    block_trigger_inputs: list[str | None] = []
    default_block_name: str | None = None

    @property
    def trigger_inputs(self) -> list[str]:
        return [t for t in self.block_trigger_inputs if t is not None]

    def select_block(self, **trigger_values: Any) -> str | None:
        """The name of the child to run for these trigger values (``None``: the default child, if any)."""
        return self.default_block_name

    def selects_on_presence(self) -> bool:
        """Whether :meth:`select_block` looks only at which triggers have a value, not at the values.

        Then the choice is made from input names alone: before the run, and the same for every call
        with those names.
        """
        return False

    def branch_conditions(self) -> dict[str, str]:
        """When each child runs, in words, by child name (the docs show it beside the child)."""
        rule = f"chosen by select_block({', '.join(self.trigger_inputs)})"
        return dict.fromkeys(self._sub_blocks, rule)

    def choose(self, known: Known) -> str | Undecided | None:
        """The child that runs given what is ``known`` (``None``: none), or ``AT_RUN_TIME``.

        ``AT_RUN_TIME``: the choice depends on a value that only the run will tell, because an earlier
        block makes it or because the walk knows the given names but not their values.
        """
        triggers = self.trigger_inputs
        if self.selects_on_presence():
            # A declared output counts as present (test_a_presence_choice_on_a_produced_value_counts_it_present).
            return self._select({t: True for t in triggers if known.present(t)})
        if any(t in known.produced for t in triggers):
            return AT_RUN_TIME  # test_a_choice_on_a_produced_value_is_left_to_run_time
        if known.values is None:
            # A plan by names asks for the values (test_a_choice_on_a_given_value_is_still_checked_before_the_run).
            if any(t in known.given for t in triggers):
                known.needs_values = True
                return AT_RUN_TIME
            return self._select({})
        return self._select({t: known.values[t] for t in triggers if t in known.values})

    def _select(self, values: Mapping[str, Any]) -> str | None:
        name = self.select_block(**{t: values.get(t) for t in self.trigger_inputs})
        if name is None:
            # None falls back to the default branch (test_none_runs_the_default_branch in test_peer_behaviours.py).
            name = self.default_block_name
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
        problems = spec_problems(self._children())
        default = self.default_block_name
        if default is not None and default not in self._sub_blocks:
            problems.append(
                f"default_block_name {default!r} is not a sub-block; sub-blocks are: {list(self._sub_blocks)}. "
                f"Name one of them, or None to skip the block when select_block returns None"
            )
        return problems

    def execution_steps(
        self, given: Known | Mapping[str, Any] | Iterable[str], path: tuple[str, ...] = ()
    ) -> list[Step]:
        """The chosen child's steps; none when no child runs; this block as one choice step when only the
        run can tell (it may then produce any child's outputs)."""
        known = Known.of(given)
        name = self.choose(known)
        if isinstance(name, Undecided):
            known.produced.update(self.intermediate_output_names)
            return [Step(self, path, StepKind.CHOICE)]
        if name is None:
            return []
        return self._sub_blocks[name].execution_steps(known, (*path, name))

    def get_execution_blocks(self, **inputs: Any) -> ModularPipelineBlocks | None:
        """The chosen child when it runs whole, the blocks that run flattened into one sequence, or ``None``."""
        steps = self.execution_steps(inputs)
        if not steps:
            return None
        if len(steps) == 1 and len(steps[0].path) == 1:
            return steps[0].block
        return blocks_of_steps(steps, self.description)


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

    def selects_on_presence(self) -> bool:
        # The stock rule looks at presence only; a subclass with its own select_block may look at values.
        return type(self).select_block is AutoPipelineBlocks.select_block

    def branch_conditions(self) -> dict[str, str]:
        if not self.selects_on_presence():
            return super().branch_conditions()
        return {
            name: f"when {trigger} given" if trigger else "default"
            for trigger, name in zip(self.block_trigger_inputs, self._sub_blocks)
        }

    def _can_skip(self) -> bool:
        return None not in self.block_trigger_inputs
