"""Blocks that run their children one after another."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from components import ComponentSpec, ConfigSpec

from .block import ModularPipelineBlocks
from .composition import (
    merge_components,
    merge_configs,
    merge_outputs,
    sequential_inputs,
    spec_problems,
    wiring_problems,
)
from .errors import BlockCompositionError
from .params import InputParam, OutputParam
from .state import PipelineState
from .sub_blocks import SubBlocks

__all__ = ["SequentialPipelineBlocks", "CompositeBlocks"]

_Composite = TypeVar("_Composite", bound="CompositeBlocks")


def run_child(name: str, block: ModularPipelineBlocks, *args: Any, **kwargs: Any) -> Any:
    """Run one child; an error carries a note naming the block it came from (no logging, no re-wrapping)."""
    try:
        return block(*args, **kwargs)
    except Exception as error:
        if hasattr(error, "add_note") and not getattr(error, "_block_noted", False):
            error.add_note(f"(raised in block {name!r}: {type(block).__name__})")
            error._block_noted = True  # type: ignore[attr-defined]  # a marker set on the instance, once
        raise


class CompositeBlocks(ModularPipelineBlocks):
    """Shared machinery of blocks made of children: construction from class attributes and validation."""

    block_classes: list[Any] = []
    block_names: list[str] = []
    _description: str  # set by from_blocks_dict only; read with a default by ``description``

    def __init__(self) -> None:
        classes, names = list(self.block_classes), list(self.block_names)
        if len(classes) != len(names):
            msg = (
                f"{type(self).__name__}: block_classes has {len(classes)} entries but block_names has "
                f"{len(names)}; give one name per block"
            )
            raise ValueError(msg)
        self._sub_blocks = SubBlocks(self._validate)
        self._sub_blocks._load(dict(zip(names, classes)))
        self._validate()

    @classmethod
    def from_blocks_dict(
        cls: type[_Composite], blocks_dict: Mapping[str, Any], description: str | None = None
    ) -> _Composite:
        """Build from ``{"name": block_or_class, ...}`` in order."""
        instance = cls.__new__(cls)
        instance._sub_blocks = SubBlocks(instance._validate)
        instance._sub_blocks._load(dict(blocks_dict))
        if description is not None:
            instance._description = description
        instance._validate()
        return instance

    @property
    def sub_blocks(self) -> SubBlocks:
        return self._sub_blocks

    @property
    def description(self) -> str:
        return getattr(self, "_description", "") or (type(self).__doc__ or "").strip().split("\n")[0]

    @property
    def model_name(self) -> str | None:  # type: ignore[override]  # read-only, from the children; the base has a class attribute
        names = {b.model_name for b in self._sub_blocks.values() if b.model_name}
        return names.pop() if len(names) == 1 else None

    def _children(self) -> list[tuple[str, ModularPipelineBlocks]]:
        return list(self._sub_blocks.items())

    def _validate(self) -> None:
        problems = self._problems()
        if problems:
            raise BlockCompositionError(type(self).__name__, problems)

    def _problems(self) -> list[str]:
        return spec_problems(self._children())

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return merge_components(self._children())

    @property
    def expected_configs(self) -> list[ConfigSpec]:
        return merge_configs(self._children())

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return merge_outputs(self._children())

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """Configure the progress bars of every loop inside, however deeply nested."""
        for child in self._sub_blocks.values():
            if hasattr(child, "set_progress_bar_config"):
                child.set_progress_bar_config(**kwargs)


class SequentialPipelineBlocks(CompositeBlocks):
    """Children run in order; each sees what earlier ones wrote to the state."""

    def _problems(self) -> list[str]:
        children = self._children()
        return spec_problems(children) + wiring_problems(children)

    @property
    def inputs(self) -> list[InputParam]:
        return sequential_inputs(self._children())

    def _leaf_blocks(self, active: dict[str, Any], prefix: str, into: list) -> None:
        for name, child in self._sub_blocks.items():
            child._leaf_blocks(active, name, into)

    def get_execution_blocks(self, **inputs: Any) -> SequentialPipelineBlocks:
        """The blocks that would run for these inputs, flattened into one sequence."""
        active = {key: value for key, value in inputs.items() if value is not None}
        leaves: list[tuple[str, ModularPipelineBlocks]] = []
        self._leaf_blocks(active, "", leaves)
        named: dict[str, ModularPipelineBlocks] = {}
        for name, block in leaves:
            key = name
            suffix = 2
            while key in named:
                key = f"{name}_{suffix}"
                suffix += 1
            named[key] = block
        result = SequentialPipelineBlocks.from_blocks_dict(named, description=self.description)
        result._workflow_map = None
        return result

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        for name, block in self._sub_blocks.items():
            components, state = run_child(name, block, components, state)
        return components, state
