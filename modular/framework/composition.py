"""Aggregating children's declarations, and checking that children fit together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from components import ComponentSpec, ConfigSpec
from components.load_id import LOAD_ID_FIELDS
from modular.framework.params import InputParam, OutputParam
from modular.framework.typecheck import hint_fits, type_name

if TYPE_CHECKING:
    from modular.framework.block import ModularPipelineBlocks

__all__ = [
    "sequential_inputs",
    "branch_inputs",
    "merge_outputs",
    "merge_components",
    "merge_configs",
    "wiring_problems",
    "spec_problems",
]

Named = Sequence[tuple[str, "ModularPipelineBlocks"]]


def sequential_inputs(children: Named, leading: Sequence[InputParam] = ()) -> list[InputParam]:
    """Inputs of children run in order: an input an earlier child produces is not an input of the whole."""
    merged: dict[str, InputParam] = {}
    grouped: list[InputParam] = []
    produced: set[str] = set()
    for param in leading:
        _add_input(merged, grouped, param)
    for child_name, child in children:
        for param in child.inputs:
            if param.name in produced:
                continue
            _add_input(merged, grouped, _with_paths(child_name, param))
        produced.update(child.intermediate_output_names)
    return list(merged.values()) + grouped


def _add_input(merged: dict[str, InputParam], grouped: list[InputParam], param: InputParam) -> None:
    if param.name is None:
        if all(p.kwargs_type != param.kwargs_type for p in grouped):
            grouped.append(param)
        return
    first = merged.get(param.name)
    if first is None:
        merged[param.name] = param
        return
    # The first declaration wins, but a later block's need is kept. Defaults are not merged: each
    # block applies its own when it reads a missing value (branches may differ, e.g. strength).
    changes: dict[str, Any] = {}
    if param.required and not first.required:
        changes["required"] = True
    if first.type_hint is None and param.type_hint is not None:
        changes["type_hint"] = param.type_hint
    if changes:
        merged[param.name] = attrs.evolve(first, **changes)


def _with_paths(child_name: str, param: InputParam) -> InputParam:
    """``param`` as its parent sees it: per-block defaults keyed by their path from the parent."""
    if param.defaults_by_block is None:
        return param
    paths = {f"{child_name}.{path}": value for path, value in param.defaults_by_block.items()}
    return attrs.evolve(param, defaults_by_block=paths)


def _same(left: Any, right: Any) -> bool:
    try:
        return left is right or bool(left == right)
    except (TypeError, ValueError, RuntimeError):  # e.g. tensors of several elements
        return False


def branch_inputs(branches: Named) -> list[InputParam]:
    """Inputs of alternative branches: required only when every branch requires it.

    Where branches declare different defaults (``None`` counts as one), the merged input's default is
    ``None`` and ``defaults_by_block`` records every branch's, by path; each branch applies its own when it
    runs (the peer's ``combine_inputs`` rule).
    """
    merged: dict[str, InputParam] = {}
    grouped: list[InputParam] = []
    counts: dict[str, int] = {}
    by_block: dict[str, dict[str, Any]] = {}
    for branch_name, branch in branches:
        for param in branch.inputs:
            if param.name is None:
                _add_input(merged, grouped, param)
                continue
            counts[param.name] = counts.get(param.name, 0) + (1 if param.required else 0)
            nested = param.defaults_by_block
            defaults = by_block.setdefault(param.name, {})
            if nested is not None:
                defaults.update({f"{branch_name}.{path}": value for path, value in nested.items()})
            else:
                defaults[branch_name] = param.default
            merged.setdefault(param.name, param)
    everywhere = len(branches)
    result = []
    for name, param in merged.items():
        changes: dict[str, Any] = {"required": counts[name] == everywhere and everywhere > 0}
        values = list(by_block[name].values())
        if any(not _same(value, values[0]) for value in values[1:]):
            changes.update(default=None, defaults_by_block=by_block[name])
        result.append(attrs.evolve(param, **changes))
    return result + grouped


def merge_outputs(children: Named, leading: Sequence[OutputParam] = ()) -> list[OutputParam]:
    merged: dict[str | None, OutputParam] = {}  # None: an output with kwargs_type only
    for param in leading:
        merged.setdefault(param.name, param)
    for _, child in children:
        for param in child.intermediate_outputs:
            merged.setdefault(param.name, param)
    return list(merged.values())


def merge_components(children: Named, leading: Sequence[ComponentSpec] = ()) -> list[ComponentSpec]:
    merged: dict[str, ComponentSpec] = {}
    for spec in [*leading, *(s for _, child in children for s in child.expected_components)]:
        first = merged.get(spec.name)
        merged[spec.name] = spec if first is None else _fill(first, spec)
    return list(merged.values())


def _fill(first: ComponentSpec, other: ComponentSpec) -> ComponentSpec:
    """``first`` with the fields it leaves empty taken from ``other``."""
    changes = {}
    for field in ("type_hint", "description", "config", *LOAD_ID_FIELDS):
        if getattr(first, field) in (None, "") and getattr(other, field) not in (None, ""):
            changes[field] = getattr(other, field)
    if first.type_hint and other.type_hint and issubclass(other.type_hint, first.type_hint):
        changes["type_hint"] = other.type_hint
    return attrs.evolve(first, **changes) if changes else first


def merge_configs(children: Named, leading: Sequence[ConfigSpec] = ()) -> list[ConfigSpec]:
    merged: dict[str, ConfigSpec] = {}
    for spec in [*leading, *(s for _, child in children for s in child.expected_configs)]:
        merged.setdefault(spec.name, spec)
    return list(merged.values())


def _disagreement(a: ComponentSpec, b: ComponentSpec) -> str | None:
    if a.default_creation_method != b.default_creation_method:
        return f"creation method {a.default_creation_method!r} vs {b.default_creation_method!r}"
    if (
        a.type_hint
        and b.type_hint
        and not (issubclass(a.type_hint, b.type_hint) or issubclass(b.type_hint, a.type_hint))
    ):
        return f"type {a.type_hint.__name__} vs {b.type_hint.__name__}"
    for field in LOAD_ID_FIELDS:
        left, right = getattr(a, field), getattr(b, field)
        if left not in (None, "") and right not in (None, "") and left != right:
            return f"{field} {left!r} vs {right!r}"
    if a.config is not None and b.config is not None and dict(a.config) != dict(b.config):
        return "config differs"
    return None


def _block_label(name: str, block: ModularPipelineBlocks) -> str:
    return f"{name!r} ({type(block).__name__})"


def spec_problems(children: Named) -> list[str]:
    """Two children declaring one component name differently."""
    problems = []
    seen: dict[str, tuple[str, ModularPipelineBlocks, ComponentSpec]] = {}
    for name, child in children:
        for spec in child.expected_components:
            if spec.name not in seen:
                seen[spec.name] = (name, child, spec)
                continue
            first_name, first_block, first_spec = seen[spec.name]
            reason = _disagreement(first_spec, spec)
            if reason:
                problems.append(
                    f"component {spec.name!r} is declared differently by {_block_label(first_name, first_block)} "
                    f"and {_block_label(name, child)} ({reason}); make the two specs agree or rename one"
                )
    return problems


def wiring_problems(children: Named, check_order: bool = True) -> list[str]:
    """Inputs that only a later child produces, and outputs whose type does not fit their consumer."""
    problems = []
    producers: dict[str | None, tuple[str, ModularPipelineBlocks, OutputParam]] = {}
    for index, (name, child) in enumerate(children):
        for param in child.inputs:
            if param.name is None:
                continue
            producer = producers.get(param.name)
            if producer is not None:
                p_name, p_block, output = producer
                if not hint_fits(output.type_hint, param.type_hint):
                    problems.append(
                        f"{_block_label(p_name, p_block)} outputs {param.name!r} as {type_name(output.type_hint)}, "
                        f"but {_block_label(name, child)} reads it as {type_name(param.type_hint)}; "
                        "make the two types agree"
                    )
            elif check_order and param.required:
                for later_name, later in children[index + 1 :]:
                    # A later block that requires the value too only changes it (a second denoising loop on
                    # the caller's latents): no sign of a wrong order. One that makes it without needing it is.
                    if (
                        param.name in later.intermediate_output_names
                        and param.name not in later.required_inputs
                    ):
                        problems.append(
                            f"{_block_label(name, child)} needs {param.name!r}, which only the later block "
                            f"{_block_label(later_name, later)} produces; move {later_name!r} before {name!r}"
                        )
                        break
        for output in child.intermediate_outputs:
            producers[output.name] = (name, child, output)
    return problems
