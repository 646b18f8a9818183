"""Splitting a model into weight groups that can be streamed onto the device one at a time.

The split follows diffusers' group offloading (``diffusers.hooks.group_offloading``): each element of a
top-level ``ModuleList``/``Sequential`` (a transformer or UNet block) is a group; a model without one is
split into its leaf modules. Everything else (the root's own tensors, the other top-level children) is the
*base* group, needed for the whole call. diffusers builds its groups inline while installing its own
hooks, which move weights with ``.to()`` regardless of any budget and keep no host copy of ours, so we
take its rule and not its code path: the offload engine decides which groups stay resident.

A tensor shared by two groups (tied weights) belongs to the base group, so dropping one group never
pulls a weight from under another.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import torch

from offload.devices.storage import plain_tensors

__all__ = ["BASE", "WeightGroup", "split_groups"]

#: The name of the group that holds what no block or leaf holds; loaded for every call of the model.
BASE = "(base)"


@attrs.frozen
class WeightGroup:
    """Modules whose own tensors move together.

    Attributes:
        name: ``"transformer_blocks.3"``, a leaf's qualified name, or ``BASE``.
        entry: The module whose forward uses the group (its forward hooks load and drop it); ``None`` for
            the base group, which is loaded while the model runs.
        owners: The modules whose own (non-recursive) parameters and buffers belong to the group.
        nbytes: Bytes of the unique storages behind those tensors.
    """

    name: str
    entry: torch.nn.Module | None
    owners: tuple[torch.nn.Module, ...]
    nbytes: int


def _own_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    for tensor in (*module._parameters.values(), *module._buffers.values()):
        if tensor is not None:
            yield tensor


def _storage_keys(owners: tuple[torch.nn.Module, ...]) -> dict[object, int]:
    """The storages behind ``owners``' own tensors, each once, with its bytes."""
    keys: dict[object, int] = {}
    for owner in owners:
        for outer in _own_tensors(owner):
            for tensor in plain_tensors(outer):
                storage = tensor.untyped_storage()
                pointer = storage.data_ptr()
                key = (tensor.device, pointer) if pointer else ("object", id(storage))
                keys.setdefault(key, storage.nbytes())
    return keys


def _owners(module: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    return tuple(m for m in module.modules() if any(True for _ in _own_tensors(m)))


def _candidates(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, tuple[torch.nn.Module, ...]]]:
    """(name, entry, owners) of each block, or each leaf that holds tensors when the model has no blocks."""
    blocks = [
        (f"{name}.{index}", block, _owners(block))
        for name, child in model.named_children()
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential))
        for index, block in enumerate(child)
    ]
    if blocks:
        return blocks
    return [
        (name, leaf, (leaf,))
        for name, leaf in model.named_modules()
        if leaf is not model
        and not any(True for _ in leaf.children())
        and any(True for _ in _own_tensors(leaf))
    ]


def split_groups(model: torch.nn.Module) -> list[WeightGroup]:
    """The base group first, then the blocks (or leaves) in the order the model registers them.

    Groups are disjoint and together hold every tensor of ``model``. A group whose storages overlap
    another's (tied or viewed weights) is folded into the base group.
    """
    candidates = [(name, entry, owners) for name, entry, owners in _candidates(model) if owners]
    keys = [_storage_keys(owners) for _, _, owners in candidates]
    counts: dict[object, int] = {}
    for group_keys in keys:
        for key in group_keys:
            counts[key] = counts.get(key, 0) + 1
    streamable = [
        (candidate, group_keys)
        for candidate, group_keys in zip(candidates, keys)
        if all(counts[key] == 1 for key in group_keys)
    ]
    taken = {id(owner) for (_, _, owners), _ in streamable for owner in owners}
    base_owners = tuple(
        m for m in model.modules() if id(m) not in taken and any(True for _ in _own_tensors(m))
    )
    base_keys = _storage_keys(base_owners)
    groups = [WeightGroup(BASE, None, base_owners, sum(base_keys.values()))]
    for (name, entry, owners), group_keys in streamable:
        # A storage the base group also holds (a view of a base tensor) stays counted there only.
        if any(key in base_keys for key in group_keys):
            base_owners += owners
            base_keys = _storage_keys(base_owners)
            groups[0] = WeightGroup(BASE, None, base_owners, sum(base_keys.values()))
            continue
        groups.append(WeightGroup(name, entry, owners, sum(group_keys.values())))
    return groups
