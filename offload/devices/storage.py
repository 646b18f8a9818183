"""Byte size of a module's weights, counted from the real storage behind its parameters and buffers."""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["module_fingerprint", "module_nbytes", "module_tensors", "plain_tensors"]


def module_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(qualified name, tensor)`` for every parameter and buffer of ``module``, each object once."""
    seen: set[int] = set()
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        yield name, tensor


def plain_tensors(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The tensors that hold ``tensor``'s bytes: itself, or, for a wrapper subclass such as a quantized
    weight (torchao, quanto: the ``__tensor_flatten__`` protocol), its inner tensors, recursively."""
    if not hasattr(type(tensor), "__tensor_flatten__"):
        yield tensor
        return
    names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    for name in names:
        yield from plain_tensors(getattr(tensor, name))


def module_nbytes(
    module: torch.nn.Module, count_meta: bool = True, device: torch.device | None = None
) -> int:
    """Return the bytes of the unique untyped storages behind ``module``'s parameters and buffers.

    Tied weights and views of one storage count once; a storage counts whole even if only a slice is
    used, because moving it moves all of it. A quantized weight counts its packed storage, not its
    logical shape. Meta tensors (data pointer 0) count by storage object, or not at all with
    ``count_meta=False`` (they hold no memory; the simulated benchmarks size models with them). Given
    ``device``, only the storages on it count.
    """
    total = 0
    seen: set[object] = set()
    alive = []  # keep storage objects alive so that id() stays unique while counting
    for _, outer in module_tensors(module):
        for tensor in plain_tensors(outer):
            if (tensor.device.type == "meta" and not count_meta) or (
                device is not None and tensor.device != device
            ):
                continue
            storage = tensor.untyped_storage()
            alive.append(storage)
            pointer = storage.data_ptr()
            key = (tensor.device, pointer) if pointer else ("object", id(storage))
            if key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
    return total


def module_fingerprint(
    module: torch.nn.Module, substitute: dict[int, int] | None = None
) -> tuple[int, int, int]:
    """A cheap summary that changes when ``module``'s weights change shape: ``(tensors, identity, bytes)``.

    ``identity`` sums the ids of the submodules and of the parameter objects (``substitute`` maps the id of
    a parameter the ledger put in a slot to the id of the one it stands for); buffers count by slot and
    size only, since the ledger gives them new objects on the device. Adding a LoRA, swapping a
    submodule, assigning a new parameter or resizing one's data all change it; a same-shape change of
    values does not (that is what ``refresh_host_copy`` is for).
    """
    substitute = substitute or {}
    count = identity = size = 0
    for owner in module.modules():
        identity += id(owner)
        for param in owner._parameters.values():
            if param is not None:
                count += 1
                identity += substitute.get(id(param), id(param))
                size += param.nbytes
        for buffer in owner._buffers.values():
            if buffer is not None:
                count += 1
                size += buffer.nbytes
    return count, identity, size
