"""Turning ``(library, class_name)`` pairs and repo config files into classes, safely."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os

from .errors import ComponentLoadError, RemoteCodeError

__all__ = [
    "TRUSTED_LIBRARIES",
    "declared_remote_code",
    "import_type",
    "is_pipeline_type",
    "remote_code_refused",
    "resolve_type_from_folder",
]

#: Libraries whose classes load without ``trust_remote_code=True``.
TRUSTED_LIBRARIES = ("diffusers", "transformers")

#: Index files that a pipeline class reads: a class whose config is one of these loads a whole repo.
PIPELINE_INDEX_FILES = ("model_index.json", "modular_model_index.json")


def is_pipeline_type(cls: type) -> bool:
    """Whether ``cls`` is a whole pipeline rather than one component.

    A pipeline's ``from_pretrained`` loads every component folder of a repo by itself, so the checks made on
    one component folder (safetensors only, no remote code) would not cover what it reads. A pipeline is a
    class whose config file is a pipeline index (diffusers' ``DiffusionPipeline``, its ``AutoPipelineFor*``
    classes and ``ModularPipeline``), or a class with ``load_components`` (a modular pipeline).
    """
    from .weights import follows_auto_map

    try:
        if follows_auto_map(cls):
            # An auto class loads one model; diffusers' AutoModel.from_pretrained leaves its class attribute
            # config_name at "model_index.json" after reading a repo's index, which must not make it a pipeline
            # (test_auto_model_stays_loadable_after_a_load_from_a_pipeline_repo).
            return False
        config_name = getattr(cls, "config_name", None)
        load_components = getattr(cls, "load_components", None)
    except ImportError:
        # diffusers' placeholders for classes whose backend is missing raise on any attribute; loading one
        # would raise the same ImportError, which says what to install.
        return False
    return config_name in PIPELINE_INDEX_FILES or callable(load_components)


def import_type(library: str, class_name: str, trust_remote_code: bool = False) -> type:
    """Resolves a class named in an index file, e.g. ``("diffusers", "UNet2DConditionModel")``.

    A library that is a diffusers pipeline module (``"stable_diffusion"`` in a classic ``model_index.json``)
    resolves inside ``diffusers.pipelines``.

    Args:
        library: Top-level module name.
        class_name: Attribute of that module.
        trust_remote_code: Allows libraries other than diffusers and transformers.

    Raises:
        RemoteCodeError: ``library`` is not trusted and ``trust_remote_code`` is False.
        ComponentLoadError: the library or class does not exist.
    """
    module_name = library
    if (
        library not in TRUSTED_LIBRARIES
        and library.isidentifier()
        and importlib.util.find_spec(f"diffusers.pipelines.{library}") is not None
    ):
        module_name = f"diffusers.pipelines.{library}"
    elif library not in TRUSTED_LIBRARIES and not trust_remote_code:
        msg = (
            f"Refusing to import {class_name!r} from library {library!r}: only {list(TRUSTED_LIBRARIES)} are "
            f"imported by default, because other code could run. Pass trust_remote_code=True if you trust it."
        )
        raise RemoteCodeError(msg)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        msg = f"Cannot import library {library!r} for class {class_name!r}: {error}. Install it, or fix the name."
        raise ComponentLoadError(msg) from error
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        msg = f"Library {library!r} has no class {class_name!r}. Check the name and the installed version."
        raise ComponentLoadError(msg)
    return cls


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    return data if isinstance(data, dict) else None


def resolve_type_from_folder(
    folder: str, where: str, trust_remote_code: bool = False, refusal: str | None = None
) -> tuple[type, bool]:
    """Finds the class to load a component folder with, from its config files.

    Looks, in order, at ``config.json`` (diffusers ``_class_name``), ``scheduler_config.json``,
    ``config.json`` (transformers ``architectures``), ``tokenizer_config.json`` (``tokenizer_class``) and
    ``preprocessor_config.json`` (``image_processor_type`` / ``feature_extractor_type``).

    Args:
        folder: The component's local folder.
        where: How the caller names the location in errors (repo, subfolder, variant, revision).
        trust_remote_code: Allows classes from a repo's ``auto_map`` (through transformers' Auto classes).
        refusal: What the error says to do when the folder needs remote code without consent.

    Returns:
        ``(cls, remote)``: the class, and whether it needs ``trust_remote_code=True`` at load time.

    Raises:
        ComponentLoadError: no config file names a class.
        RemoteCodeError: the config names custom code and ``trust_remote_code`` is False.
    """
    config = _read_json(os.path.join(folder, "config.json")) or {}
    scheduler = _read_json(os.path.join(folder, "scheduler_config.json")) or {}
    tokenizer = _read_json(os.path.join(folder, "tokenizer_config.json")) or {}
    processor = _read_json(os.path.join(folder, "preprocessor_config.json")) or {}
    for data, auto_class in ((config, "AutoModel"), (tokenizer, "AutoTokenizer")):
        if "auto_map" in data:
            if not trust_remote_code:
                raise RemoteCodeError(remote_code_refused(where, data["auto_map"], refusal))
            return import_type("transformers", auto_class), True
    candidates = [
        ("diffusers", config.get("_class_name")),
        ("diffusers", scheduler.get("_class_name")),
        ("transformers", (config.get("architectures") or [None])[0]),
        ("transformers", tokenizer.get("tokenizer_class")),
        ("transformers", processor.get("image_processor_type") or processor.get("feature_extractor_type")),
    ]
    for library, class_name in candidates:
        if isinstance(class_name, str) and class_name:
            return import_type(library, class_name, trust_remote_code), False
    msg = (
        f"Cannot tell which class to load {where} with: none of config.json, scheduler_config.json, "
        f"tokenizer_config.json or preprocessor_config.json in {folder} names one. Give the spec a type_hint."
    )
    raise ComponentLoadError(msg)


def declared_remote_code(folder: str) -> object | None:
    """The ``auto_map`` a component folder's config declares (its own code), or ``None``."""
    for name in ("config.json", "tokenizer_config.json"):
        data = _read_json(os.path.join(folder, name)) or {}
        if "auto_map" in data:
            return data["auto_map"]
    return None


def remote_code_refused(where: str, auto_map: object, refusal: str | None = None) -> str:
    """The message of a refused load of a folder that declares custom code."""
    fix = refusal or "Pass trust_remote_code=True if you trust the repo, or give a type_hint."
    return (
        f"{where} declares custom code (auto_map {auto_map!r}), which runs only with trust_remote_code. {fix}"
    )
