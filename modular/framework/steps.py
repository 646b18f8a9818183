"""One walk of the block tree: the steps that run, in order, for what is known before they run.

Every block kind lists its steps with ``execution_steps(given)``; the call plan, the pruned blocks
(``get_execution_blocks``), the docs and the run all read that one list, so they cannot disagree.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from components import ComponentSpec
    from modular.framework.block import ModularPipelineBlocks

__all__ = ["AT_RUN_TIME", "Known", "Step", "StepKind", "Undecided"]


class StepKind(enum.Enum):
    """How a step runs."""

    LEAF = "leaf"
    """A block that runs as a whole (its own ``__call__``)."""
    LOOP = "loop"
    """A loop: its own ``__call__`` iterates, and each iteration runs ``body``."""
    CHOICE = "choice"
    """A choice the walk cannot make before the run (it depends on a value not known yet): the block
    chooses on the values in the state when it is reached."""


@attrs.frozen
class Step:
    """One unit of a run.

    Attributes:
        block: the block that runs.
        path: the names from the walked block down to ``block`` (``()`` for the walked block itself).
        kind: how it runs.
        uses: the components the step itself uses, in order, as far as is known before the run (a
            loop's own components, not its body's; none for a choice made at run time).
        body: a loop's steps, run once per iteration.
    """

    block: ModularPipelineBlocks
    path: tuple[str, ...] = ()
    kind: StepKind = StepKind.LEAF
    uses: tuple[ComponentSpec, ...] = ()
    body: tuple[Step, ...] = ()

    @property
    def name(self) -> str:
        """The block's name in its parent (``""`` for the walked block itself)."""
        return self.path[-1] if self.path else ""


class Undecided(enum.Enum):
    """What a choice answers when only the run can tell which child runs."""

    AT_RUN_TIME = "at run time"


AT_RUN_TIME = Undecided.AT_RUN_TIME


@attrs.define
class Known:
    """What a walk knows before the steps run; the walk adds what each step it lists will produce.

    Attributes:
        given: names given a value (``None`` counts as not given).
        values: the given values, when the walk has them (``None``: it knows names only).
        produced: names that steps listed so far produce (their values are known only at run time).
        needs_values: set by a choice that could be made with the given values, which the walk lacks.
    """

    given: frozenset[str]
    values: Mapping[str, Any] | None = None
    produced: set[str] = attrs.field(factory=set)
    needs_values: bool = False

    @classmethod
    def of(cls, given: Known | Mapping[str, Any] | Iterable[str]) -> Known:
        """``given`` itself, or what is known from names (an iterable) or from values (a mapping)."""
        if isinstance(given, Known):
            return given
        if isinstance(given, str):
            msg = f"given must be input values (a mapping) or input names (an iterable of str), got the str {given!r}"
            raise TypeError(msg)
        if isinstance(given, Mapping):
            values = {name: value for name, value in given.items() if value is not None}
            return cls(frozenset(values), values)
        return cls(frozenset(given))

    def present(self, name: str) -> bool:
        """Whether ``name`` will have a value: given, or produced by an earlier step."""
        return name in self.given or name in self.produced
