"""The mark of a model whose weights differ from its source: what changed them, and whether they are back.

A model's load ID names where its weights came from. Once they change in place (a fused LoRA, an edit the
manager was told of with ``refresh_host_copy``) the load ID still names the source but the values are not the
source's: the model carries a mark, the manager's model info and table show it, and the manager never hands
the model out as the source's weights (``Registry.find_reusable``). The mark lives on the model, as its
adapters do, so every manager and pipeline sharing it reads the same one.

Unfusing a LoRA subtracts what fusing added, in floating point, so the values need not come back bit for bit:
the mark is dropped only when the unfused weights equal the source files' (``matches_source``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .weight_sources import weight_files

__all__ = [
    "EDITED",
    "FUSED_LORA",
    "clear_modified",
    "is_modified",
    "mark_modified",
    "matches_source",
    "modifications",
]

#: The attribute of a model holding its marks: ``{kind: description}``.
MODIFIED = "_weights_modified"
#: A LoRA is (or was) fused into the weights.
FUSED_LORA = "fused_lora"
#: The weights were edited in place (``ComponentsManager.refresh_host_copy``).
EDITED = "edited"


def mark_modified(module: Any, kind: str, description: str) -> None:
    """Marks ``module``'s weights as differing from its source: ``kind`` (one mark per kind) and why."""
    marks = dict(getattr(module, MODIFIED, None) or {})
    marks[kind] = description
    object.__setattr__(module, MODIFIED, marks)  # not a submodule or parameter: a plain attribute


def clear_modified(module: Any, kind: str) -> None:
    """Drops the mark of ``kind`` (its weights are the source's again in that respect)."""
    marks = dict(getattr(module, MODIFIED, None) or {})
    marks.pop(kind, None)
    object.__setattr__(module, MODIFIED, marks)


def modifications(module: Any) -> list[str] | None:
    """How ``module``'s weights differ from its source (one description per mark), or ``None`` when they do not."""
    marks = getattr(module, MODIFIED, None)
    return list(marks.values()) if marks else None


def is_modified(module: Any) -> bool:
    """Whether ``module`` carries a mark: it must not stand in for its source's weights."""
    return bool(getattr(module, MODIFIED, None))


def matches_source(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> bool | None:
    """Whether ``tensors`` (some of ``module``'s, by their names in its source files) equal the files' values.

    ``None`` when that cannot be told: no source files on disk (a model built in memory, a hub repo not in the
    cache), or a key the files do not hold under that name. Values are compared in the model's dtype, as
    loading cast them.
    """
    from safetensors import safe_open

    files = weight_files(module)
    if not files:
        return None
    wanted = set(tensors)
    found: set[str] = set()
    for path in files:
        with safe_open(path, framework="pt") as handle:
            for key in wanted.intersection(handle.keys()):
                tensor = tensors[key]
                source = handle.get_tensor(key).to(dtype=tensor.dtype)
                if not torch.equal(tensor.detach().to("cpu"), source):
                    return False
                found.add(key)
    return True if found == wanted else None
