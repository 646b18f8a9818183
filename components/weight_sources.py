"""The safetensors files a component was loaded from, found from its load ID: what offload reads it back from."""

from __future__ import annotations

import os
from typing import Any

from huggingface_hub import errors as hub_errors
from huggingface_hub import snapshot_download

from .load_id import NULL_LOAD_ID, decode_load_id, get_load_id
from .weights import file_variant

__all__ = ["weight_files"]


def weight_files(component: Any) -> tuple[str, ...]:
    """The safetensors files of ``component``'s load ID: those of its variant in its folder, or its single file.

    Nothing is downloaded: a hub repo is looked up in the local cache only. A component without a load ID
    (built in memory), or whose files are not on disk, has none; the offload engine then writes what it
    must drop to its spill folder instead. The files are not opened here; the engine reads their headers
    and compares the values before it relies on them.
    """
    load_id = get_load_id(component)
    if load_id is None or load_id == NULL_LOAD_ID:
        return ()
    fields = decode_load_id(load_id)
    repo = fields["pretrained_model_name_or_path"]
    if repo is None:
        return ()
    if os.path.isfile(repo):
        return (os.path.abspath(repo),) if repo.endswith(".safetensors") else ()
    root = repo if os.path.isdir(repo) else _cached_snapshot(repo, fields["revision"])
    if root is None:
        return ()
    folder = os.path.join(root, fields["subfolder"] or "")
    if not os.path.isdir(folder):
        return ()
    names = sorted(
        name
        for name in os.listdir(folder)
        if name.endswith(".safetensors") and file_variant(name) == fields["variant"]
    )
    return tuple(os.path.abspath(os.path.join(folder, name)) for name in names)


def _cached_snapshot(repo: str, revision: str | None) -> str | None:
    try:
        return snapshot_download(repo, revision=revision, local_files_only=True)
    except (hub_errors.LocalEntryNotFoundError, hub_errors.HFValidationError, OSError, ValueError):
        return None  # not in the cache, or not a repo id: nothing to read back from
