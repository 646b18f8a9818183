"""Checks made before a pipeline call runs anything, so a bad call changes nothing."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

import attrs

from .block import ModularPipelineBlocks
from .conditional import ConditionalPipelineBlocks
from .errors import (
    ComponentNotLoadedError,
    InputTypeError,
    MissingInputError,
    UnknownInputError,
    UnknownOutputError,
)
from .params import InputParam
from .typecheck import type_name, value_matches

__all__ = ["CallPlan", "plan_call", "walk_leaves"]


def walk_leaves(
    block: ModularPipelineBlocks, name: str = "", into_choices: bool = True
) -> Iterator[tuple[str, ModularPipelineBlocks]]:
    """Every block that declares its own work (leaves and loop children), depth first, in order.

    With ``into_choices=False`` a conditional block is one unit: its branch is chosen at run time.
    """
    children = block.sub_blocks
    if not children or (not into_choices and isinstance(block, ConditionalPipelineBlocks)):
        yield name, block
        return
    if hasattr(block, "loop_step"):
        yield name, block  # the loop itself declares loop_expected_components and loop_inputs
    for child_name, child in children.items():
        yield from walk_leaves(child, child_name, into_choices)


@attrs.frozen
class CallPlan:
    """What a call with these inputs will run: the blocks, and the models they use in order."""

    leaves: tuple[tuple[str, ModularPipelineBlocks], ...]
    component_uses: tuple[str, ...]
    outputs: frozenset[str]


def known_inputs(blocks: ModularPipelineBlocks) -> dict[str, InputParam]:
    """Every input any block reads (the pipeline's own inputs first, so their merged form wins)."""
    params: dict[str, InputParam] = {}
    for param in blocks.inputs:
        if param.name:
            params[param.name] = param
    for _, leaf in walk_leaves(blocks):
        for param in leaf.inputs:
            if param.name:
                params.setdefault(param.name, param)
        for param in getattr(leaf, "loop_inputs", []):
            if param.name:
                params.setdefault(param.name, param)
    return params


def check_inputs(pipeline_name: str, params: dict[str, InputParam], given: dict[str, Any]) -> None:
    """Unknown keywords and values of the wrong type, each a TypeError naming the input."""
    for key, value in given.items():
        param = params.get(key)
        if param is None:
            close = difflib.get_close_matches(key, list(params), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            msg = f"{pipeline_name}() got an unknown input {key!r}{hint} (inputs: {sorted(params)})"
            raise UnknownInputError(msg)
        if not value_matches(value, param.type_hint):
            msg = (
                f"{pipeline_name}(): input {key!r} must be {type_name(param.type_hint)} "
                f"(got {_short(value)} that is a {type(value).__name__})"
            )
            raise InputTypeError(msg)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def plan_call(blocks: ModularPipelineBlocks, given: dict[str, Any], components: dict[str, Any]) -> CallPlan:
    """The execution plan for these inputs; raises for missing inputs and unloaded components."""
    present = {key: value for key, value in given.items() if value is not None}
    executed = blocks.get_execution_blocks(**present)
    leaves = tuple(walk_leaves(executed, into_choices=False)) if executed is not None else ()
    produced: set[str] = set()
    uses: list[str] = []
    for name, leaf in leaves:
        params = list(leaf.inputs) + list(getattr(leaf, "loop_inputs", []))
        for param in params:
            if param.required and param.name and param.name not in present and param.name not in produced:
                if param.default is None:
                    msg = (
                        f"block {name!r} ({type(leaf).__name__}) needs input {param.name!r}, which was not given "
                        f"and no earlier block produces; pass {param.name}=..."
                    )
                    raise MissingInputError(msg)
        produced.update(leaf.intermediate_output_names)
        for param in getattr(leaf, "loop_intermediate_outputs", []):
            produced.add(param.name)
        # A block with children here is a loop (its own components are the loop's) or a choice made
        # at run time (which branch, and so which components, is not known before the run).
        specs = (
            list(leaf.expected_components)
            if not leaf.sub_blocks
            else list(getattr(leaf, "loop_expected_components", []))
        )
        for spec in specs:
            if components.get(spec.name) is None:
                msg = (
                    f"block {name!r} ({type(leaf).__name__}) needs component {spec.name!r}, which is not loaded; "
                    f"call pipe.load_components([{spec.name!r}]) (or pipe.update_components({spec.name}=...)) first"
                )
                raise ComponentNotLoadedError(msg)
            uses.append(spec.name)
    return CallPlan(leaves=leaves, component_uses=tuple(uses), outputs=frozenset(produced | set(given)))


def check_output(output: Any, plan: CallPlan) -> None:
    """``output=`` must name values this call produces (or inputs it was given)."""
    if output is None:
        return
    names = [output] if isinstance(output, str) else list(output)
    for name in names:
        if name not in plan.outputs:
            msg = f"output={name!r} is not produced by this call; available outputs: {sorted(plan.outputs)}"
            raise UnknownOutputError(msg)
