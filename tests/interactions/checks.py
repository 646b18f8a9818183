"""The invariants the interaction tests check after every operation, each an assert with what differs.

- every weight a read path returns (``state_dict()``) is a real value: no NaN placeholder of a dropped host
  copy, no infinity;
- a model that the manager says holds its source's weights (its load ID names a repo folder, no fused LoRA,
  not quantized) holds exactly the tensors of that folder's files;
- the side under test and its shadow tell the same story: the same load IDs, adapters, LoRA marks,
  IP-Adapters and quantization per pipeline component, and the same objects shared between pipelines.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Collection, Iterator
from typing import Any

import torch
import transformers
from safetensors.torch import load_file
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from components.load_id import get_load_id

from .world import Side

#: The model-info fields whose values must not depend on offload; compared between the two sides.
TOLD_FIELDS = ("class_name", "dtype", "load_id", "adapters", "lora", "ip_adapter", "quantization", "modified")
_OBJECT_ADDRESS = re.compile(r"@0x[0-9a-f]+")


def plain_tensors(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors behind ``tensor``: itself, or a wrapper subclass's inner ones (torchao), recursively."""
    if not is_traceable_wrapper_subclass(tensor):
        yield tensor
        return
    names, _ = tensor.__tensor_flatten__()
    for name in names:
        yield from plain_tensors(getattr(tensor, name))


def assert_weights_readable(side: Side, skip: Collection[str] = ()) -> None:
    """Every floating tensor of every registered model's ``state_dict()`` is finite (models in ``skip`` aside)."""
    for component_id, model in side.models().items():
        if component_id in skip:
            continue
        for key, tensor in model.state_dict().items():
            for plain in plain_tensors(tensor):
                if plain.is_floating_point() and plain.numel() and not torch.isfinite(plain).all():
                    msg = f"{component_id}: state_dict()[{key!r}] holds NaN or inf (a placeholder read?)"
                    raise AssertionError(msg)


def source_folder(load_id: str | None) -> str | None:
    """The local folder a load ID names (``repo/subfolder``), or ``None`` when it names none."""
    if not load_id or load_id == "null":
        return None
    repo, subfolder, variant, _revision = load_id.split("|")
    if variant != "null":
        return None
    folder = repo if subfolder == "null" else os.path.join(repo, subfolder)
    return folder if os.path.isdir(folder) else None


def claims_source_weights(info: dict[str, Any]) -> bool:
    """Whether the model info says the model holds its source's weights as loaded: not marked modified (a
    fused LoRA, even once unloaded; an edit told to the manager), no fused LoRA adapter and no quantization."""
    fused = any(adapter["fused"] for adapter in info["lora"] or [])
    return not info["modified"] and not fused and info["quantization"] is None


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict under its unwrapped names: peft's ``base_layer`` unwrapped, LoRA layers left out."""
    return {
        key.replace(".base_layer", ""): tensor
        for key, tensor in model.state_dict().items()
        if ".lora_" not in key
    }


@functools.cache
def folder_tensors(folder: str, model_class: type) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weights under the names the model's class gives them: a transformers
    model read back with its class (transformers saves some, such as Mistral3, under older checkpoint names
    and renames them on loading), anything else from its safetensors files (variant files left out)."""
    if issubclass(model_class, transformers.PreTrainedModel):
        return dict(model_class.from_pretrained(folder).state_dict())
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors") and name.count(".") == 1:
            tensors.update(load_file(os.path.join(folder, name)))
    return tensors


def assert_claims_true(side: Side, skip: Collection[str] = ()) -> None:
    """A model that claims its source's weights (``claims_source_weights``) holds exactly its folder's tensors
    (models in ``skip`` aside)."""
    for component_id, model in side.models().items():
        if component_id in skip:
            continue
        info = side.cm.get_model_info(component_id, ["lora", "quantization", "load_id", "modified"])
        folder = source_folder(info["load_id"])
        if folder is None or not claims_source_weights(info):
            continue
        held, stored = base_weights(model), folder_tensors(folder, type(model))
        shared = sorted(set(held) & set(stored))
        assert shared, f"{component_id}: none of its tensors is in {folder}"
        differ = [key for key in shared if not torch.equal(held[key], stored[key])]
        assert not differ, (
            f"{component_id} claims the weights of {info['load_id']} (lora {info['lora']}), but "
            f"{len(differ)} tensors differ from its files, e.g. {differ[:3]}"
        )


def told(side: Side, component_id: str) -> dict[str, Any]:
    """The model info of ``TOLD_FIELDS``, without what names one side's objects (ids, pipeline labels)."""
    info = side.cm.get_model_info(component_id, list(TOLD_FIELDS))
    if info["lora"]:
        info["lora"] = [{k: v for k, v in adapter.items() if k != "loaded_by"} for adapter in info["lora"]]
    if info["ip_adapter"]:
        info["ip_adapter"] = {
            k: v for k, v in info["ip_adapter"].items() if k not in ("image_encoder", "loaded_by")
        }
    if info["modified"]:  # its reasons name the pipeline that changed it, by its object's address
        info["modified"] = [_OBJECT_ADDRESS.sub("", reason) for reason in info["modified"]]
    return info


def sharing(side: Side) -> list[set[tuple[str, str]]]:
    """Which (pipeline, component) pairs hold the same model object, as a sorted list of groups."""
    groups: dict[int, set[tuple[str, str]]] = {}
    for pipe_name, pipe in side.live().items():
        for name, obj in pipe.components.items():
            if isinstance(obj, torch.nn.Module):
                groups.setdefault(id(obj), set()).add((pipe_name, name))
    return sorted(groups.values(), key=sorted)


def assert_sides_agree(main: Side, shadow: Side) -> None:
    """Both sides tell the same facts about each pipeline's models, and share the same objects; the table
    prints, naming every registered model's load ID."""
    assert set(main.live()) == set(shadow.live())
    for pipe_name, pipe in main.live().items():
        other = shadow.live()[pipe_name]
        for name, obj in pipe.components.items():
            if not isinstance(obj, torch.nn.Module):
                continue
            main_id, shadow_id = main.cm.get_id(obj), shadow.cm.get_id(other.components[name])
            assert (main_id is None) == (shadow_id is None), (
                f"{pipe_name}.{name}: registered on one side only"
            )
            if main_id is None or shadow_id is None:
                continue
            mine, theirs = told(main, main_id), told(shadow, shadow_id)
            assert mine == theirs, f"{pipe_name}.{name}: the manager says {mine}; without offload {theirs}"
    assert sharing(main) == sharing(shadow)
    table = main.cm.table()  # the full table: print(cm) fits the terminal, shortening load IDs
    for obj in main.models().values():
        load_id = get_load_id(obj)
        if load_id is not None:
            assert load_id in table, f"the table does not name {load_id}"
