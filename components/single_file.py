"""Loading a component from one checkpoint file through diffusers' single-file loading (``from_single_file``).

A spec whose ``pretrained_model_name_or_path`` is a local ``.safetensors`` file (or, with ``use_pickle=True``,
a ``.ckpt``/``.pt``/``.pth``/``.bin`` file) loads with ``type_hint.from_single_file``: diffusers converts the
original layouts it knows (LDM UNets and VAEs, Flux, ...) and reads the model's config from ``config=`` (a
diffusers folder or repo id) or, without it, from the default config it infers for the checkpoint. The load ID
is the file's path. diffusers does the reading and converting; this module only adds the checks every load
gets here (no pickle without consent, whole files, a class that supports it) before diffusers reads the file.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from .errors import ComponentLoadError, PickleWeightsError
from .load_id import tag_load_id
from .load_kwargs import PASSED_ON_OPTIONS
from .weights import check_safetensors

if TYPE_CHECKING:
    from .spec import ComponentSpec

__all__ = ["SINGLE_FILE_SUFFIXES", "is_single_file", "load_single_file"]

_SAFE = ".safetensors"
#: The checkpoint files a spec may name directly; all but ``.safetensors`` are pickle files.
SINGLE_FILE_SUFFIXES = (_SAFE, ".ckpt", ".pt", ".pth", ".bin")


def is_single_file(path: str | None) -> bool:
    """Whether ``path`` is an existing local checkpoint file (rather than a folder or a hub repo id)."""
    if not path:
        return False
    expanded = os.path.expanduser(path)
    return expanded.endswith(SINGLE_FILE_SUFFIXES) and os.path.isfile(expanded)


def load_single_file(spec: ComponentSpec, dtype: torch.dtype | None, options: dict[str, Any]) -> Any:
    """Loads ``spec`` from its checkpoint file with ``spec.type_hint.from_single_file``, tagged with its load ID.

    Args:
        spec: A spec whose repo is a checkpoint file (:func:`is_single_file`) and whose type_hint is the model
            class; its subfolder, if any, is the config's inside ``config``.
        dtype: The dtype to load in, or ``None``.
        options: The load options; ``config`` (a diffusers folder or repo id holding the model's config),
            ``use_pickle``, ``quantization_config``, ``device_map``, ``low_cpu_mem_usage``, ``local_files_only``,
            ``token``, ``cache_dir`` are used.

    Raises:
        ComponentLoadError: no type_hint, a class without single-file support, a variant or revision (which a
            single file does not have), or a subfolder without ``config``.
        PickleWeightsError: a pickle checkpoint without ``use_pickle=True``.
        CorruptWeightsError: a truncated safetensors file.
    """
    path = os.path.expanduser(str(spec.pretrained_model_name_or_path))
    where = f"single file {spec.pretrained_model_name_or_path!r} of component {spec.name!r}"
    # A subfolder names where the config lies inside config= (as in from_single_file); variant and revision mean
    # nothing for one file.
    extra = {k: getattr(spec, k) for k in ("variant", "revision") if getattr(spec, k)}
    if spec.subfolder and options.get("config") is None:
        extra["subfolder"] = spec.subfolder
    if extra:
        msg = (
            f"The {where} has {extra}, which a single checkpoint file does not have (a subfolder is the config's, "
            f"inside config=). Drop them, pass config=..., or point pretrained_model_name_or_path at a diffusers "
            f"folder or repo instead."
        )
        raise ComponentLoadError(msg)
    cls = spec.type_hint
    if cls is None:
        msg = f"The {where} does not say which class it holds; give the spec a type_hint (e.g. UNet2DConditionModel)."
        raise ComponentLoadError(msg)
    loader = getattr(cls, "from_single_file", None)
    if not callable(loader):
        msg = (
            f"The {where} is declared as {cls.__module__}.{cls.__qualname__}, which has no from_single_file: "
            f"diffusers loads single files for its own model classes that support them. Declare such a class, or "
            f"save the model with save_pretrained() and point the spec at that folder."
        )
        raise ComponentLoadError(msg)
    if path.endswith(_SAFE):
        check_safetensors(path)
    elif not options.get("use_pickle", False):
        msg = (
            f"The {where} is a pickle file; pickle files can run code when loaded, so they are refused by "
            f"default. Pass use_pickle=True to load it if you trust it, or convert it to safetensors."
        )
        raise PickleWeightsError(msg)
    kwargs: dict[str, Any] = {key: options[key] for key in PASSED_ON_OPTIONS if options.get(key) is not None}
    if options.get("config") is not None:
        kwargs["config"] = os.fspath(options["config"])
        if spec.subfolder:
            kwargs["subfolder"] = spec.subfolder
    for key in ("token", "cache_dir"):
        if options.get(key) is not None:
            kwargs[key] = options[key]
    if options.get("local_files_only"):
        kwargs["local_files_only"] = True
    if dtype is not None:
        kwargs["torch_dtype"] = dtype
    component = loader(path, **kwargs)
    tag_load_id(component, spec.load_id)
    return component
