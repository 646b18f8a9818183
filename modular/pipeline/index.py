"""Reading and writing pipeline index files: ``modular_model_index.json`` and the classic ``model_index.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub.errors import (
    EntryNotFoundError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from components import ComponentSpec, import_type
from components.errors import ComponentLoadError, PipelineTypeError, RemoteCodeError
from components.importing import is_pipeline_type
from components.load_id import LOAD_ID_FIELDS
from components.remote_code import RemoteCodeConsent, consent_covers, consent_for_pipeline
from components.repo import mistyped_folder
from modular.errors import IndexFileError
from modular.pipeline.index_checks import CLASSIC_INDEX, ENTRY_FIELDS, MODULAR_INDEX, check_index

__all__ = [
    "CLASSIC_INDEX",
    "absent_components",
    "ENTRY_FIELDS",
    "MODULAR_INDEX",
    "check_index",
    "read_index",
    "specs_from_index",
    "spec_to_entry",
]


def read_index(
    repo: str | os.PathLike,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """Find and parse a repo's index: ``modular_model_index.json`` first, else ``model_index.json``.

    Returns ``(file name, parsed dict)``. ``repo`` is a local folder or a hub repo id (resolved through
    huggingface_hub: cache, revision, token, offline mode).
    """
    repo = str(repo)
    if os.path.isdir(repo):
        from modular.pipeline.saving import recover_interrupted_save  # here: saving imports this module

        recover_interrupted_save(repo)
        for name in (MODULAR_INDEX, CLASSIC_INDEX):
            path = Path(repo, name)
            if path.is_file():
                return name, _parse(path)
        msg = f"{repo}: neither {MODULAR_INDEX} nor {CLASSIC_INDEX} is in this folder; is it a pipeline repo?"
        raise FileNotFoundError(msg)
    if repo.startswith((".", "/", "~")) or repo.count("/") > 1:
        msg = f"{repo!r} is not a folder on disk, nor a hub repo id like 'org/name'; check the path"
        raise FileNotFoundError(msg)
    errors = []
    for name in (MODULAR_INDEX, CLASSIC_INDEX):
        try:
            downloaded = huggingface_hub.hf_hub_download(
                repo, name, revision=revision, token=token, cache_dir=cache_dir
            )
        except (EntryNotFoundError, LocalEntryNotFoundError) as error:
            errors.append(error)
            continue
        except RevisionNotFoundError:
            msg = f"{repo}: revision {revision!r} does not exist; use a branch, tag or commit of this repo"
            raise ValueError(msg) from None
        except RepositoryNotFoundError:
            msg = f"{repo}: no such repo on the hub (or no access: pass token=...)"
            raise FileNotFoundError(msg) from None
        return name, _parse(Path(downloaded))
    folder = mistyped_folder(repo)
    if folder is not None:
        msg = f"{repo}: {folder}; check the path (as a hub repo id it has no index file here either)"
        raise FileNotFoundError(msg) from errors[-1]
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    hint = (
        "the hub is offline (HF_HUB_OFFLINE=1) and it is not in the local cache; download it first or unset HF_HUB_OFFLINE"
        if offline
        else "it has no index file, or the hub could not be reached"
    )
    at = f" at revision {revision!r}" if revision else ""
    msg = f"{repo}{at}: cannot read {MODULAR_INDEX} or {CLASSIC_INDEX}: {hint}"
    raise FileNotFoundError(msg) from errors[-1]


def _parse(path: Path) -> dict[str, Any]:
    """The index in ``path``, checked with ``check_index`` (the file's name says which kind it is)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise IndexFileError(str(path), [f"not valid JSON ({error}); the index file is damaged"]) from None
    except UnicodeDecodeError as error:
        raise IndexFileError(str(path), [f"not UTF-8 text ({error}); the index file is damaged"]) from None
    except RecursionError:
        problem = "its JSON is nested too deeply to read; an index file is a flat object of entries"
        raise IndexFileError(str(path), [problem]) from None
    check_index(path.name, data, str(path))
    return data


def specs_from_index(
    kind: str,
    index: dict[str, Any],
    repo: str,
    revision: str | None = None,
    trust_remote_code: RemoteCodeConsent = False,
) -> tuple[dict[str, ComponentSpec], dict[str, Any]]:
    """Component specs and config values declared by an index.

    In a classic ``model_index.json`` each ``name: [library, class]`` entry means "this repo,
    subfolder = name"; ``[null, null]`` entries are components the pipeline does not have.
    ``trust_remote_code`` reaches only the entries of the repos it covers (``True``: the index's own repo;
    ``components.remote_code``).

    Raises:
        IndexFileError: the index is malformed (see ``check_index``); nothing has been imported.
        PipelineTypeError: an entry declares a whole pipeline class as a component.
    """
    source = os.path.join(repo, kind)
    check_index(kind, index, source)
    consent = consent_for_pipeline(trust_remote_code, repo, source)
    specs: dict[str, ComponentSpec] = {}
    config: dict[str, Any] = {}
    for name, value in index.items():
        if name.startswith("_"):
            continue
        if not _is_component_entry(value):
            config[name] = value
            continue
        library, class_name = value[0], value[1]
        if kind == CLASSIC_INDEX:
            if library is None or class_name is None:
                continue
            type_hint = import_type(library, class_name, trust_remote_code=consent_covers(consent, repo))
            _refuse_pipeline(source, name, type_hint)
            specs[name] = ComponentSpec(
                name=name,
                type_hint=type_hint,
                pretrained_model_name_or_path=repo,
                subfolder=name,
                revision=revision,
            )
            continue
        fields = _loading_fields(value[2])
        hint = fields.pop("type_hint", None) or (library, class_name)
        subfolder = fields.get("subfolder")
        # No repo but a subfolder: the component lives in this repo (how a saved folder points at itself).
        here = fields.get("pretrained_model_name_or_path") is None and bool(subfolder)
        entry_repo = repo if here else fields.get("pretrained_model_name_or_path")
        declared: type | None = None
        if hint and hint[0] and hint[1]:
            try:
                declared = import_type(
                    hint[0], hint[1], trust_remote_code=consent_covers(consent, entry_repo)
                )
            except RemoteCodeError:
                raise
            except ComponentLoadError as error:  # an unknown class: name the entry, import nothing more
                raise IndexFileError(source, [f"entry {name!r}: {error}"]) from error
            _refuse_pipeline(source, name, declared)
        specs[name] = ComponentSpec(
            name=name,
            type_hint=declared,
            pretrained_model_name_or_path=repo if here else fields.get("pretrained_model_name_or_path"),
            subfolder="" if subfolder is None else subfolder,
            variant=fields.get("variant"),
            revision=revision if here else fields.get("revision"),
        )
    return specs, config


def absent_components(kind: str, index: dict[str, Any]) -> list[str]:
    """The components an index says the repo does not have: ``[null, null]`` entries (Wan 2.1's
    ``transformer_2``, Wan 2.2's ``image_encoder``), and in a modular index ``[null, null, {...}]`` entries that
    name no repo and no subfolder to load from."""
    names = []
    for name, value in index.items():
        if (
            name.startswith("_")
            or not _is_component_entry(value)
            or value[0] is not None
            or value[1] is not None
        ):
            continue
        fields = _loading_fields(value[2] if len(value) == 3 else None)
        if kind == CLASSIC_INDEX or not (
            fields.get("pretrained_model_name_or_path") or fields.get("subfolder")
        ):
            names.append(name)
    return names


def _loading_fields(fields: dict[str, Any] | None) -> dict[str, Any]:
    """An entry's loading fields, with the peer's deprecated ``repo`` read as ``pretrained_model_name_or_path``."""
    fields = dict(fields or {})
    repo = fields.pop("repo", None)
    if fields.get("pretrained_model_name_or_path") is None and repo is not None:
        fields["pretrained_model_name_or_path"] = repo
    return fields


def _refuse_pipeline(source: str, name: str, cls: type) -> None:
    if is_pipeline_type(cls):
        msg = (
            f"{source}: entry {name!r} declares {cls.__module__}.{cls.__qualname__}, a whole pipeline, as a "
            f"component; loading it would load another repo's components (pickle files included) past the "
            f"checks made on one component folder. Declare the component's own class (a model, scheduler or "
            f"tokenizer class), or remove the entry."
        )
        raise PipelineTypeError(msg)


def _is_component_entry(value: Any) -> bool:
    if not isinstance(value, list | tuple) or len(value) not in (2, 3):
        return False
    if not all(v is None or isinstance(v, str) for v in value[:2]):
        return False
    return len(value) == 2 or value[2] is None or isinstance(value[2], dict)


def library_and_class(obj_or_type: Any) -> tuple[str | None, str | None]:
    """``("diffusers", "UNet2DConditionModel")`` for a component or its type."""
    if obj_or_type is None:
        return None, None
    cls = obj_or_type if isinstance(obj_or_type, type) else type(obj_or_type)
    return cls.__module__.split(".")[0], cls.__name__


def spec_to_entry(spec: ComponentSpec, component: Any = None) -> list[Any]:
    """The index entry of one component, in the peer's shape: ``[library, class, {loading fields, type_hint}]``."""
    library, class_name = library_and_class(component)
    fields: dict[str, Any] = {key: getattr(spec, key) for key in LOAD_ID_FIELDS}
    fields["type_hint"] = list(library_and_class(spec.type_hint))
    return [library, class_name, fields]
