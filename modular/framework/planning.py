"""Planning a pipeline call: which steps run and which models they use, checked before anything runs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from modular.errors import (
    ComponentNotLoadedError,
    InputTypeError,
    MissingInputError,
    UnknownInputError,
    UnknownOutputError,
)
from modular.framework.block import ModularPipelineBlocks
from modular.framework.params import InputParam
from modular.framework.steps import Known, Step
from modular.framework.sub_blocks import blocks_generation
from modular.framework.typecheck import type_name, value_matches

__all__ = [
    "CallPlan",
    "PlanCache",
    "check_inputs",
    "check_output",
    "every_block",
    "known_inputs",
    "plan_call",
    "tagged_inputs",
]


@attrs.frozen
class CallPlan:
    """What a call with these inputs will run: the steps, and the models they use in order.

    Attributes:
        steps: the steps, from :meth:`~modular.ModularPipelineBlocks.execution_steps`.
        component_uses: the components the steps use, in order (a choice made at run time adds none).
        outputs: the names the call produces, and those it was given.
        needs_values: the plan was made from input names, and a choice in it could be made before the
            run from the given values (a custom ``select_block`` on a given input): plan with the values.
    """

    steps: tuple[Step, ...]
    component_uses: tuple[str, ...]
    outputs: frozenset[str]
    needs_values: bool = False


def every_block(block: ModularPipelineBlocks) -> Iterator[ModularPipelineBlocks]:
    """``block`` and all blocks inside it, children before their parent."""
    for child in block.sub_blocks.values():
        yield from every_block(child)
    yield block


def known_inputs(blocks: ModularPipelineBlocks) -> dict[str, InputParam]:
    """Every input any block reads (the pipeline's own inputs first, so their merged form wins).

    A group that blocks read whole (``InputParam(kwargs_type="denoiser_input_fields")``) is known by its
    kwargs_type, as the nameless param, unless a named input has that name: the caller may pass the group
    as one dict (:func:`tagged_inputs`).
    """
    params: dict[str, InputParam] = {}
    groups: dict[str, InputParam] = {}
    for block in (blocks, *every_block(blocks)):
        for param in block.inputs:
            if param.name:
                params.setdefault(param.name, param)
            elif param.kwargs_type:
                groups.setdefault(param.kwargs_type, param)
    for kind, param in groups.items():
        params.setdefault(kind, param)
    return params


def tagged_inputs(
    params: Mapping[str, InputParam], given: Mapping[str, Any]
) -> dict[str, tuple[Any, str | None]]:
    """The call's values by state key, each with its kwargs_type tag; a group given as one dict is spread.

    ``pipe(denoiser_input_fields={"prompt_embeds": e})`` puts ``prompt_embeds`` into the state tagged
    ``denoiser_input_fields``, as the peer does. :func:`check_inputs` has checked ``given``.
    """
    tagged: dict[str, tuple[Any, str | None]] = {}
    groups = []
    for key, value in given.items():
        param = params[key]
        if param.name is None:
            groups.append((key, value))
        else:
            tagged[key] = (value, param.kwargs_type)
    for kind, members in groups:
        for member, value in members.items():
            if value is not None:
                tagged[member] = (value, kind)
    return tagged


def _unknown_input(
    pipeline_name: str, key: str, params: Mapping[str, InputParam], blocks: ModularPipelineBlocks | None
) -> str:
    close = difflib.get_close_matches(key, list(params), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    if key == "return_dict":  # a diffusers habit: say what stands for it here
        hint = "; a call returns the state, or one value with output='images' (diffusers' return_dict)"
    offered = [p.name for p in blocks.inputs if p.name] if blocks is not None else list(params)
    offered += [
        p.kwargs_type for p in (blocks.inputs if blocks is not None else ()) if not p.name and p.kwargs_type
    ]
    ranked = sorted(
        dict.fromkeys(offered), key=lambda name: (-difflib.SequenceMatcher(None, key, name).ratio(), name)
    )
    shown = ", ".join(ranked[:_SHOWN_INPUTS])
    more = f" and {len(ranked) - _SHOWN_INPUTS} more" if len(ranked) > _SHOWN_INPUTS else ""
    return f"{pipeline_name}() got an unknown input {key!r}{hint} (inputs, closest first: {shown}{more}; pipe.doc lists them)"


def _check_group(pipeline_name: str, kind: str, value: Any, params: Mapping[str, InputParam]) -> None:
    """A group given as one value must be a dict of identifiers; members that are named inputs are type-checked."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        msg = (
            f"{pipeline_name}(): input {kind!r} is a group of inputs (kwargs_type {kind!r}) and must be a dict "
            f"of input names to values, e.g. {kind}={{'prompt_embeds': ...}} (got {_short(value)} that is a "
            f"{type(value).__name__})"
        )
        raise InputTypeError(msg)
    for member, member_value in value.items():
        param = params.get(member)
        if param is not None and param.name is not None and not value_matches(member_value, param.type_hint):
            msg = (
                f"{pipeline_name}(): input {member!r} in {kind} must be {type_name(param.type_hint)} "
                f"(got {_short(member_value)} that is a {type(member_value).__name__})"
            )
            raise InputTypeError(msg)


# How many of the inputs a user can pass an unknown-input error names, closest first.
_SHOWN_INPUTS = 12


def check_inputs(
    pipeline_name: str,
    params: dict[str, InputParam],
    given: dict[str, Any],
    blocks: ModularPipelineBlocks | None = None,
) -> None:
    """Unknown keywords and values of the wrong type, each a TypeError naming the input.

    An unknown keyword's message lists the inputs a caller can pass (``blocks.inputs``: not the values blocks
    make for each other), closest to it first.
    """
    for key, value in given.items():
        param = params.get(key)
        if param is None:
            raise UnknownInputError(_unknown_input(pipeline_name, key, params, blocks))
        if param.name is None:
            _check_group(pipeline_name, key, value, params)
            twice = sorted(set(value) & set(given))
            if twice:
                msg = (
                    f"{pipeline_name}() got multiple values for input(s) {twice}: by name and inside "
                    f"{key}={{...}}; pass each one way"
                )
                raise TypeError(msg)
            continue
        if not value_matches(value, param.type_hint):
            msg = (
                f"{pipeline_name}(): input {key!r} must be {type_name(param.type_hint)} "
                f"(got {_short(value)} that is a {type(value).__name__})"
            )
            raise InputTypeError(msg)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def plan_call(
    blocks: ModularPipelineBlocks,
    given: Mapping[str, Any] | Iterable[str],
    components: Mapping[str, Any],
    absent: frozenset[str] = frozenset(),
    unlisted: frozenset[str] = frozenset(),
) -> CallPlan:
    """The plan for these input values (a mapping) or names; raises for missing inputs and unloaded components.

    A component in `absent` (the repo has none) that a step lists in its ``optional_components`` is planned
    without: it is not among the plan's uses, so offload never places it. Those of them in `unlisted` are absent
    because a classic index does not list them (not by a ``[null, null]`` entry): a step that needs one is told
    to load it, as for any component not loaded."""
    known = Known.of(given)
    steps = tuple(blocks.execution_steps(known))
    produced: set[str] = set()
    uses: list[str] = []
    _check_steps(steps, known.given, produced, uses, components, absent, unlisted)
    return CallPlan(steps, tuple(uses), frozenset(produced | known.given), known.needs_values)


def _check_steps(
    steps: Iterable[Step],
    given: frozenset[str],
    produced: set[str],
    uses: list[str],
    components: Mapping[str, Any],
    absent: frozenset[str],
    unlisted: frozenset[str],
) -> None:
    for step in steps:
        block = step.block
        for param in block.inputs:
            if param.required and param.name and param.name not in given and param.name not in produced:
                if param.default is None:
                    msg = (
                        f"block {step.name!r} ({type(block).__name__}) needs input {param.name!r}, which was "
                        f"not given and no earlier block produces; pass {param.name}=..."
                    )
                    raise MissingInputError(msg)
        produced.update(block.intermediate_output_names)
        for spec in step.uses:
            if components.get(spec.name) is None and spec.name in absent:
                if spec.name in block.optional_components:
                    continue  # the repo has none, and the block runs without it
            if components.get(spec.name) is None and spec.name in absent and spec.name not in unlisted:
                msg = (
                    f"block {step.name!r} ({type(block).__name__}) needs component {spec.name!r}, which this "
                    f"repo does not have (its index lists {spec.name!r} as [null, null]); give the pipeline one "
                    f"with pipe.update_components({spec.name}=...), or use a repo that has it"
                )
                raise ComponentNotLoadedError(msg)
            if components.get(spec.name) is None:
                msg = (
                    f"block {step.name!r} ({type(block).__name__}) needs component {spec.name!r}, which is not "
                    f"loaded; call pipe.load_components([{spec.name!r}]) (or pipe.update_components({spec.name}=...)) "
                    "first"
                )
                raise ComponentNotLoadedError(msg)
            uses.append(spec.name)
        _check_steps(step.body, given, produced, uses, components, absent, unlisted)


def check_output(output: Any, plan: CallPlan, given: Iterable[str] = ()) -> None:
    """``output=`` must name values this call produces (or inputs it was given, ``None`` or not)."""
    if output is None:
        return
    available = plan.outputs.union(given)
    names = [output] if isinstance(output, str) else list(output)
    for name in names:
        if name not in available:
            msg = f"output={name!r} is not produced by this call; available outputs: {sorted(available)}"
            raise UnknownOutputError(msg)


@attrs.define
class _Plans:
    generation: int
    by_names: dict[frozenset[str], CallPlan] = attrs.field(factory=dict)
    params: dict[str, InputParam] | None = None


class PlanCache:
    """One pipeline's call plans by the set of given input names, and the inputs its blocks read.

    Valid while no sub-blocks are edited (anywhere: :func:`~modular.framework.sub_blocks.blocks_generation`) and
    until :meth:`forget`, which the pipeline calls when its components change. Each change swaps in a
    fresh table, so a plan made while another thread changes things is not kept.
    """

    def __init__(self) -> None:
        self._plans: _Plans | None = None

    def forget(self) -> None:
        """Drop every plan (the components changed)."""
        self._plans = None

    def _current(self) -> _Plans:
        plans, generation = self._plans, blocks_generation()
        if plans is None or plans.generation != generation:
            plans = self._plans = _Plans(generation)
        return plans

    def params(self, blocks: ModularPipelineBlocks) -> dict[str, InputParam]:
        """:func:`known_inputs` of ``blocks``, worked out once."""
        plans = self._current()
        if plans.params is None:
            plans.params = known_inputs(blocks)
        return plans.params

    def plan(
        self,
        blocks: ModularPipelineBlocks,
        given: Mapping[str, Any],
        components: Mapping[str, Any],
        absent: frozenset[str] = frozenset(),
        unlisted: frozenset[str] = frozenset(),
    ) -> CallPlan:
        """The plan for the names given a value, made once per set of names (with the values when it needs them)."""
        plans = self._current()
        names = frozenset(name for name, value in given.items() if value is not None)
        plan = plans.by_names.get(names)
        if plan is None:
            plan = plans.by_names[names] = plan_call(blocks, names, components, absent, unlisted)
        if plan.needs_values:
            return plan_call(blocks, given, components, absent, unlisted)
        return plan
