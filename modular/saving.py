"""``save_pretrained``: components and a ``modular_model_index.json``, written all at once or not at all."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import diffusers

from .families import family_of_blocks
from .index import MODULAR_INDEX, spec_to_entry

if TYPE_CHECKING:
    from .pipeline import ModularPipeline

__all__ = ["save_pipeline", "index_dict"]


def index_dict(
    pipe: ModularPipeline, saved_to: str | None = None, saved: Collection[str] = frozenset()
) -> dict[str, Any]:
    """The index in the peer's shape; components in ``saved`` point at ``saved_to/<name>``."""
    data: dict[str, Any] = {
        "_blocks_class_name": pipe._blocks_class_name,
        "_class_name": _peer_pipeline_class_name(pipe),
        "_diffusers_version": diffusers.__version__,
    }
    if pipe._workflow:
        data["_workflow"] = pipe._workflow
    data.update(pipe._config)
    for name, spec in pipe._specs.items():
        if spec.default_creation_method != "from_pretrained":
            continue
        entry = spec_to_entry(spec, pipe._components[name])
        if name in saved:
            entry[2].update(
                pretrained_model_name_or_path=saved_to, subfolder=name, variant=None, revision=None
            )
        data[name] = entry
    return data


def _peer_pipeline_class_name(pipe: ModularPipeline) -> str:
    """The pipeline class diffusers' modular system should build for these blocks (the family says)."""
    family = family_of_blocks(pipe._blocks_class_name)
    return family.peer_pipeline_class if family is not None else "ModularPipeline"


def _save_component(obj: Any, folder: Path) -> None:
    save = getattr(obj, "save_pretrained", None)
    if save is None:
        msg = f"cannot save {type(obj).__name__} to {folder}: it has no save_pretrained method"
        raise TypeError(msg)
    kwargs = {}
    if "safe_serialization" in inspect.signature(save).parameters:
        kwargs["safe_serialization"] = True
    save(str(folder), **kwargs)


def save_pipeline(pipe: ModularPipeline, save_directory: str | os.PathLike) -> None:
    """Write into a temporary sibling folder, then swap it into place; a failure leaves nothing behind."""
    target = Path(save_directory).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        saved = set()
        for name, spec in pipe._specs.items():
            obj = pipe._components[name]
            if spec.default_creation_method != "from_pretrained" or obj is None:
                continue
            _save_component(obj, staging / name)
            saved.add(name)
        index = index_dict(pipe, saved_to=str(target), saved=saved)
        (staging / MODULAR_INDEX).write_text(json.dumps(index, indent=2, sort_keys=False) + "\n")
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_into_place(staging: Path, target: Path) -> None:
    if not target.exists():
        os.replace(staging, target)
        return
    if not target.is_dir():
        msg = f"cannot save to {target}: it exists and is not a folder"
        raise FileExistsError(msg)
    backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    backup.rmdir()
    os.replace(target, backup)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(backup, target)
        raise
    shutil.rmtree(backup, ignore_errors=True)
