"""What every block made of children shares: construction, validation, aggregation and running steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from components import ComponentSpec, ConfigSpec
from modular.errors import BlockCompositionError
from modular.framework.block import ModularPipelineBlocks
from modular.framework.composition import merge_components, merge_configs, merge_outputs, spec_problems
from modular.framework.params import OutputParam
from modular.framework.state import PipelineState
from modular.framework.steps import Step
from modular.framework.sub_blocks import SubBlocks

if TYPE_CHECKING:
    from modular.watch.watch import CallWatch

__all__ = ["CompositeBlocks", "run_child", "run_steps"]

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


def run_steps(
    steps: Iterable[Step], components: Any, state: PipelineState, watch: CallWatch | None = None
) -> tuple[Any, PipelineState]:
    """Run steps in order; each runs its block (a loop iterates, a choice chooses on the state then).

    With a call's ``watch`` (``modular/watch/watch.py``), its cancel is checked before each step and
    it reports each step's start and end."""
    for step in steps:
        if watch is not None:
            stage = ".".join(step.path) or type(step.block).__name__
            watch.block_started(stage)
        if step.path:
            components, state = run_child(step.name, step.block, components, state)
        else:  # the walked block itself is a leaf or a loop: its caller names it
            components, state = step.block(components, state)
        if watch is not None:
            watch.block_finished(stage)
    return components, state


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

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        """Run the steps :meth:`execution_steps` lists for the values in ``state``."""
        return run_steps(self.execution_steps(state.values), components, state)

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """Configure the progress bars of every loop inside, however deeply nested."""
        for child in self._sub_blocks.values():
            child.set_progress_bar_config(**kwargs)
