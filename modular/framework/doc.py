"""Human-readable descriptions of blocks: the ``doc`` text and the tree shown by ``repr``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modular.framework.conditional import ConditionalPipelineBlocks
from modular.framework.steps import StepKind
from modular.framework.typecheck import type_name

if TYPE_CHECKING:
    from modular.framework.block import ModularPipelineBlocks

__all__ = ["make_doc", "make_tree"]


def _first_line(text: str) -> str:
    return text.strip().split("\n")[0] if text else ""


def make_doc(block: ModularPipelineBlocks) -> str:
    """Components, configs, inputs (type, default, required), outputs and workflows of ``block``."""
    lines = [f"class {type(block).__name__}", ""]
    if block.description:
        lines += [f"  {line}" for line in block.description.strip().split("\n")] + [""]
    workflows = block._workflow_map or {}
    if workflows:
        lines.append("  Workflows:")
        for name, triggers in workflows.items():
            lines.append(f"    {name}: {', '.join(triggers)}")
        lines.append("")
        lines.append("  Steps per workflow:")
        for name, triggers in workflows.items():
            lines.append(f"    {name}: {_steps_line(block, triggers)}")
        lines.append("")
    if block.expected_components:
        lines.append("  Components:")
        for spec in block.expected_components:
            kind = type_name(spec.type_hint) if spec.type_hint else "Any"
            how = "" if spec.default_creation_method == "from_pretrained" else " [from config]"
            desc = f": {spec.description}" if spec.description else ""
            lines.append(f"    {spec.name} ({kind}){how}{desc}")
        lines.append("")
    if block.expected_configs:
        lines.append("  Configs:")
        for config in block.expected_configs:
            desc = f": {config.description}" if config.description else ""
            lines.append(f"    {config.name} (default: {config.default!r}){desc}")
        lines.append("")
    lines.append("  Inputs:")
    for param in block.inputs:
        name = param.name or f"**{param.kwargs_type}"
        facts = [type_name(param.type_hint)]
        if param.required:
            facts.append("required")
        elif param.defaults_by_block is not None:
            facts.append(f"default by branch: {_defaults_by_value(param.defaults_by_block)}")
        elif param.default is not None:
            facts.append(f"default: {param.default!r}")
        desc = f": {param.description}" if param.description else ""
        lines.append(f"    {name} ({', '.join(facts)}){desc}")
    lines.append("")
    lines.append("  Outputs:")
    for output in block.intermediate_outputs:
        desc = f": {output.description}" if output.description else ""
        lines.append(f"    {output.name} ({type_name(output.type_hint)}){desc}")
    return "\n".join(lines).rstrip() + "\n"


def _defaults_by_value(defaults_by_block: Mapping[str, Any]) -> str:
    """``0.9999 (refine, image.inpaint), 0.3 (image.img2img)``: each distinct default once, as the peer shows
    them, with the branches that use it (which the peer does not say)."""
    groups: list[tuple[Any, list[str]]] = []
    for path, value in defaults_by_block.items():
        for known, paths in groups:
            if _same_value(known, value):
                paths.append(path)
                break
        else:
            groups.append((value, [path]))
    return ", ".join(f"{value!r} ({', '.join(paths)})" for value, paths in groups)


def _same_value(left: Any, right: Any) -> bool:
    try:
        return left is right or bool(left == right)
    except (TypeError, ValueError, RuntimeError):  # e.g. tensors of several elements
        return False


def make_tree(block: ModularPipelineBlocks, name: str | None = None, indent: int = 0) -> str:
    """The block and its children as an indented tree, with each block's kind and first description line."""
    kind = type(block).__name__
    bases = [b.__name__ for b in type(block).__mro__[1:] if b.__module__.startswith("modular.")]
    base = f" [{bases[0]}]" if bases and bases[0] != "ModularPipelineBlocks" else ""
    label = f"{name}: " if name else ""
    desc = _first_line(block.description)
    pad = "  " * indent
    lines = [f"{pad}{label}{kind}{base}" + (f"  # {desc}" if desc else "")]
    # A choice describes when each child runs itself (by presence, by value, ...): no guessing here.
    conditions = block.branch_conditions() if isinstance(block, ConditionalPipelineBlocks) else {}
    for child_name, child in block.sub_blocks.items():
        condition = conditions.get(child_name)
        child_label = f"{child_name} ({condition})" if condition else child_name
        lines.append(make_tree(child, child_label, indent + 1))
    return "\n".join(lines)


def _steps_line(block: ModularPipelineBlocks, given: Mapping[str, Any]) -> str:
    """The names of the steps that run for ``given``, in order (a choice left to run time is marked)."""
    names = []
    for step in block.execution_steps(given):
        label = step.name or type(step.block).__name__
        names.append(f"{label} (chosen at run time)" if step.kind is StepKind.CHOICE else label)
    return " -> ".join(names) or "(nothing runs)"
