"""The editable, ordered children of a composite block; every edit is re-validated."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modular.framework.block import ModularPipelineBlocks

__all__ = ["SubBlocks", "blocks_generation"]

_edits = itertools.count(1)
_generation = 0


def blocks_generation() -> int:
    """A number that changes whenever sub-blocks are edited anywhere (what caches of walks are keyed on)."""
    return _generation


class SubBlocks(MutableMapping[str, "ModularPipelineBlocks"]):
    """An ordered ``name -> block`` mapping owned by a composite block.

    Edits (``insert``, ``pop``, item assignment, ``del``) re-run the owner's composition checks; an
    edit that breaks the composition raises and leaves the children as they were.
    """

    def __init__(self, validate: Callable[[], None] | None = None) -> None:
        self._items: dict[str, ModularPipelineBlocks] = {}
        self._validate = validate

    def _edit(self, change: Callable[[dict], Any]) -> Any:
        global _generation
        before = dict(self._items)
        try:
            result = change(self._items)
            if self._validate is not None:
                try:
                    self._validate()
                except Exception:
                    self._items = before
                    raise
        finally:
            # After the edit (refused ones too: forgetting a plan is always safe), so that a walk made
            # during the edit is not kept.
            _generation = next(_edits)
        return result

    @staticmethod
    def _check(name: str, block: Any) -> ModularPipelineBlocks:
        from modular.framework.block import ModularPipelineBlocks

        if isinstance(block, type) and issubclass(block, ModularPipelineBlocks):
            block = block()
        if not isinstance(name, str) or not name:
            msg = f"sub-block names must be non-empty strings (got {name!r})"
            raise TypeError(msg)
        if isinstance(block, type):
            # The peer instantiates any class; a block here declares what it reads, writes and runs.
            msg = (
                f"sub-block {name!r} is the class {block.__name__}, which does not subclass ModularPipelineBlocks; "
                f"declare it as class {block.__name__}(ModularPipelineBlocks) (its inputs, outputs and __call__)"
            )
            raise TypeError(msg)
        if not isinstance(block, ModularPipelineBlocks):
            msg = f"sub-block {name!r} must be a ModularPipelineBlocks instance or class (got a {type(block).__name__})"
            raise TypeError(msg)
        return block

    def _load(self, items: dict[str, Any]) -> None:
        """Fill without validating (the owner validates once when it is built)."""
        self._items = {name: self._check(name, block) for name, block in items.items()}

    def __getitem__(self, name: str) -> ModularPipelineBlocks:
        try:
            return self._items[name]
        except KeyError:
            msg = f"no sub-block named {name!r}; sub-blocks are: {list(self._items)}"
            raise KeyError(msg) from None

    def __setitem__(self, name: str, block: Any) -> None:
        block = self._check(name, block)
        self._edit(lambda items: items.__setitem__(name, block))

    def __delitem__(self, name: str) -> None:
        self[name]  # noqa: B018  (raises the readable KeyError)
        self._edit(lambda items: items.__delitem__(name))

    def insert(self, name: str, block: Any, index: int) -> None:
        """Insert ``block`` under ``name`` at position ``index``."""
        block = self._check(name, block)
        if name in self._items:
            msg = f"a sub-block named {name!r} exists already; pick another name or assign to replace it"
            raise KeyError(msg)

        def change(items: dict) -> None:
            pairs = list(items.items())
            pairs.insert(index, (name, block))
            items.clear()
            items.update(pairs)

        self._edit(change)

    def pop(self, name: str, *default: Any) -> Any:
        if name not in self._items and default:
            return default[0]
        block = self[name]
        self._edit(lambda items: items.pop(name))
        return block

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name!r}: {type(block).__name__}" for name, block in self._items.items())
        return f"SubBlocks({{{inner}}})"
