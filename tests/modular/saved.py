"""What the saving tests read back: a saved folder's index, and whether two models hold the same weights."""

import json
from typing import Any

import torch

from modular.pipeline.index import MODULAR_INDEX


def saved_index(folder) -> dict[str, Any]:
    """The ``modular_model_index.json`` a save wrote into ``folder``."""
    return json.loads((folder / MODULAR_INDEX).read_text())


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two models hold equal tensors under the same names."""
    first, second = a.state_dict(), b.state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
