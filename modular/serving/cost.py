"""What a job costs to start, in bytes: the weights its pipeline would bring to the device given what is there now.

For each model of the workflow's pipeline: nothing when the manager holds it (same load ID) on the device
(the engine's residency; a partly resident model counts its streamed share), its size when the manager
holds it off the device, and its weight files' size when it is not loaded at all (it must be read, then
moved). Without auto offload a loaded model stays where it is and costs nothing. The scheduler runs next
the waiting job whose pipeline costs least, so jobs that share models run together.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub
import torch

from components import ComponentsManager, ComponentSpec
from components.errors import ComponentNotFoundError
from modular.pipeline.pipeline import ModularPipeline

__all__ = ["bytes_to_bring", "device_bytes", "file_bytes", "pipeline_models", "registered"]

_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@functools.lru_cache(maxsize=256)
def file_bytes(repo: str, subfolder: str | None) -> int:
    """The size of the weight files of a repo's ``subfolder``: a local folder, or a hub repo's snapshot in the
    local cache (nothing is downloaded); 0 when neither is found. Cached: weight files do not change under
    a running server."""
    folder = Path(repo) / (subfolder or "")
    if not folder.is_dir():
        try:
            snapshot = huggingface_hub.snapshot_download(repo, local_files_only=True)
        except Exception:  # not a hub id, or not in the cache: ranked as costing nothing to read
            return 0
        folder = Path(snapshot) / (subfolder or "")
        if not folder.is_dir():
            return 0
    return sum(
        path.stat().st_size for path in folder.iterdir() if path.is_file() and path.name.endswith(_WEIGHTS)
    )


def registered(manager: ComponentsManager, load_id: str) -> tuple[str, Any] | None:
    """``(component id, component)`` of one the manager holds with this load ID, or ``None``."""
    try:
        found = manager.search_components(load_id=load_id, return_dict_with_names=False)
    except ComponentNotFoundError:
        return None
    return next(iter(found.items()), None)


def device_bytes(manager: ComponentsManager, component_id: str, module: torch.nn.Module) -> int:
    """Bytes of ``module`` the engine that places it would move to the device now (0 when none places it)."""
    for engine in manager.offload_engines:
        if engine.has_hook(component_id):
            residency = engine.residency(component_id)
            nbytes = engine.nbytes(component_id)
            if residency.resident_share is not None:
                return round(nbytes * (1.0 - residency.resident_share))
            return 0 if residency.resident or residency.pinned else nbytes
    return 0


def pipeline_models(
    manager: ComponentsManager, pipe: ModularPipeline
) -> Iterator[tuple[str, ComponentSpec, Any]]:
    """``(load ID, spec, what the manager holds for it)`` for each component of ``pipe`` loaded from a repo; the
    last is ``(component id, component)``, or ``None`` when the manager holds none with that load ID."""
    for name in pipe.pretrained_component_names:
        spec = pipe.get_component_spec(name)
        if spec.pretrained_model_name_or_path:
            load_id = str(spec.load_id)
            yield load_id, spec, registered(manager, load_id)


def bytes_to_bring(manager: ComponentsManager, pipe: ModularPipeline) -> int:
    """The bytes ``pipe``'s models would move to the device if it ran now (see the module docstring)."""
    total = 0
    for _, spec, found in pipeline_models(manager, pipe):
        if found is None:
            total += file_bytes(str(spec.pretrained_model_name_or_path), spec.subfolder)
        elif isinstance(found[1], torch.nn.Module):
            total += device_bytes(manager, *found)
    return total
