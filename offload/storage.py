"""Byte size of a module's weights, counted from the real storage behind its parameters and buffers."""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["module_nbytes", "module_tensors"]


def module_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(qualified name, tensor)`` for every parameter and buffer of ``module``, each object once."""
    seen: set[int] = set()
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        yield name, tensor


def module_nbytes(module: torch.nn.Module) -> int:
    """Return the bytes of the unique untyped storages behind ``module``'s parameters and buffers.

    Tied weights and views of one storage count once; a storage counts whole even if only a slice is
    used, because moving it moves all of it. Meta tensors (data pointer 0) count by storage object.
    """
    total = 0
    seen: set[object] = set()
    alive = []  # keep storage objects alive so that id() stays unique while counting
    for _, tensor in module_tensors(module):
        storage = tensor.untyped_storage()
        alive.append(storage)
        pointer = storage.data_ptr()
        key = (tensor.device, pointer) if pointer else ("object", id(storage))
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total
