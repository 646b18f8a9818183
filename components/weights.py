"""Checks on a component folder's weight files before a library reads them."""

from __future__ import annotations

import json
import os
import struct

from .errors import (
    ComponentLoadError,
    CorruptWeightsError,
    MissingComponentFileError,
    PickleWeightsError,
    VariantNotFoundError,
)

__all__ = [
    "PICKLE_SUFFIXES",
    "check_config",
    "check_weight_file",
    "check_weights",
    "check_safetensors",
    "file_variant",
    "follows_auto_map",
    "loads_weights",
]

_SAFETENSORS = (".safetensors",)
#: Weight files read with pickle, which can run code: loaded only with ``use_pickle=True``.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_PICKLE = PICKLE_SUFFIXES


def file_variant(filename: str) -> str | None:
    """The variant a weight file belongs to, from its name.

    ``diffusion_pytorch_model.fp16.safetensors`` -> ``"fp16"``; ``model.fp16-00001-of-00002.safetensors`` ->
    ``"fp16"``; ``model.safetensors`` and ``model-00001-of-00002.safetensors`` -> ``None``.
    """
    parts = filename.split(".")
    if len(parts) <= 2:
        return None
    return parts[-2].split("-")[0]


def loads_weights(cls: type) -> bool:
    """Whether ``cls.from_pretrained`` reads weight files, and so takes ``use_safetensors``, ``variant``, ``dtype``.

    True for models (``torch.nn.Module``) and for the libraries' model auto classes (diffusers' and
    transformers' ``AutoModel*``), which pass those options on to the model class they pick.
    """
    import torch
    from diffusers import AutoModel

    bases: tuple[type, ...] = (torch.nn.Module, AutoModel)
    try:
        from transformers.models.auto.auto_factory import _BaseAutoModelClass
    except ImportError:  # pragma: no cover - the base moved; models are still caught as nn.Module
        pass
    else:
        bases += (_BaseAutoModelClass,)
    return issubclass(cls, bases)


def follows_auto_map(cls: type) -> bool:
    """Whether ``cls.from_pretrained`` picks its class from the folder's config, and so may run the folder's own
    code (``auto_map``): diffusers' and transformers' auto classes."""
    from diffusers import AutoModel

    bases: tuple[type, ...] = (AutoModel,)
    try:
        from transformers.models.auto.auto_factory import _BaseAutoModelClass
    except ImportError:  # pragma: no cover - the base moved
        pass
    else:
        bases += (_BaseAutoModelClass,)
    return issubclass(cls, bases)


def check_config(folder: str, where: str, cls: type) -> None:
    """Checks that a component folder holds the config file ``cls`` reads, before the library looks for it.

    The file is ``cls.config_name`` for diffusers classes (``config.json``, ``scheduler_config.json``) and
    ``config.json`` for other classes that load weights; other classes (tokenizers, processors) pass.

    Raises:
        MissingComponentFileError: the config file is not there.
    """
    # An auto class reads config.json; diffusers' AutoModel leaves its config_name at model_index.json after
    # reading a repo's index (test_auto_model_stays_loadable_after_a_load_from_a_pipeline_repo).
    config_name = None if follows_auto_map(cls) else getattr(cls, "config_name", None)
    if not isinstance(config_name, str):
        config_name = "config.json" if loads_weights(cls) else None
    if config_name is None or os.path.isfile(os.path.join(folder, config_name)):
        return
    present = sorted(os.listdir(folder))
    msg = (
        f"{where} has no {config_name} (files present: {present}); {cls.__name__} reads its config from it. "
        f"Check the repo and subfolder, or save the component there again with save_pretrained()."
    )
    raise MissingComponentFileError(msg)


def check_safetensors(path: str) -> None:
    """Reads a safetensors header and checks that the file holds every byte it declares.

    Raises:
        CorruptWeightsError: the file is shorter than its header says, or the header is unreadable.
    """
    size = os.path.getsize(path)
    fix = "Delete it and download or save it again (for a hub repo: `hf download <repo> --force-download`)."
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            msg = f"Weight file {path} is truncated: {size} bytes, too short for a safetensors header. {fix}"
            raise CorruptWeightsError(msg)
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            msg = (
                f"Weight file {path} is truncated: its header needs {8 + header_len} bytes, the file has {size}. "
                f"{fix}"
            )
            raise CorruptWeightsError(msg)
        try:
            header = json.loads(handle.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            msg = f"Weight file {path} has an unreadable safetensors header ({error}). {fix}"
            raise CorruptWeightsError(msg) from error
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    needed = 8 + header_len + max(ends, default=0)
    if needed > size:
        msg = f"Weight file {path} is truncated: it declares {needed} bytes, the file has {size}. {fix}"
        raise CorruptWeightsError(msg)


def check_weight_file(folder: str, name: str, *, use_pickle: bool, what: str, where: str) -> str:
    """The path of the weight file ``name`` in ``folder``, checked before a loader reads it.

    For files a user names (a LoRA, an IP-Adapter): it must exist, and be a whole safetensors file, or a
    pickle file with ``use_pickle=True``. ``what`` names the kind of file, ``where`` the repo, in messages.

    Raises:
        MissingComponentFileError: no such file (the files present are listed).
        PickleWeightsError: a pickle file without ``use_pickle=True``.
        CorruptWeightsError: a truncated safetensors file.
        ComponentLoadError: any other format.
    """
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        present = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)))
        msg = (
            f"{where} has no {what} file {name!r} (files present: {present}); pass one of them as weight_name"
        )
        raise MissingComponentFileError(msg)
    if name.endswith(PICKLE_SUFFIXES):
        if not use_pickle:
            msg = (
                f"{where}: {name!r} is a pickle file; pickle files can run code when loaded, so they are refused "
                "by default. Use a .safetensors file, or pass use_pickle=True if you trust it."
            )
            raise PickleWeightsError(msg)
    elif name.endswith(_SAFETENSORS):
        check_safetensors(path)
    else:
        msg = f"{where}: {name!r} is neither a .safetensors file nor (with use_pickle=True) a .bin/.pt file"
        raise ComponentLoadError(msg)
    return path


def check_weights(
    folder: str, where: str, variant: str | None, use_pickle: bool, needs_weights: bool = False
) -> None:
    """Checks a component folder before loading: the variant exists, the format is allowed, files are whole.

    A folder without weight files (a tokenizer, a scheduler) passes unless ``needs_weights``. Without
    ``use_pickle``, a pickle file in a folder nested inside ``folder`` is refused too, whatever sits beside
    it: only a loader that reads more than its own folder (which ``ComponentSpec.load`` refuses) would read
    it, and it must not.

    Raises:
        MissingComponentFileError: ``needs_weights`` and the folder has no weight file at all.
        VariantNotFoundError: weights exist, but none for ``variant`` (or only variants when none is asked).
        PickleWeightsError: only pickle weights exist for the variant, or a nested folder holds pickle files,
            and ``use_pickle`` is False.
        CorruptWeightsError: a safetensors file that would be loaded is truncated.
    """
    names = sorted(os.listdir(folder))
    weights = [name for name in names if name.endswith(_SAFETENSORS + _PICKLE)]
    if not use_pickle:
        nested = _nested_pickle_files(folder)
        if nested:
            msg = (
                f"{where} holds pickle files in nested folders ({nested}); pickle files can run code when "
                f"loaded, so they are refused by default. Remove or convert them to safetensors, or pass "
                f"use_pickle=True if you trust the repo."
            )
            raise PickleWeightsError(msg)
    if not weights:
        if needs_weights:
            allowed = "*.safetensors or, with use_pickle=True, *.bin/*.pt/*.pth/*.ckpt"
            msg = (
                f"{where} has no weight file ({allowed}); files present: {names}. Check the repo and "
                f"subfolder, or save the component there again with save_pretrained()."
            )
            raise MissingComponentFileError(msg)
        return
    chosen = [name for name in weights if file_variant(name) == variant]
    if not chosen:
        available = sorted({str(file_variant(name)) for name in weights})
        if variant is None:
            msg = (
                f"{where} has no default weights, only variants {available} ({weights}). Pass variant=... "
                f"with one of them."
            )
        else:
            msg = (
                f"{where} has no weights for variant {variant!r}; variants present: {available} (None is the "
                f"default) in files {weights}. Pass one of those variants, or variant=None."
            )
        raise VariantNotFoundError(msg)
    safetensors = [name for name in chosen if name.endswith(_SAFETENSORS)]
    if not safetensors and not use_pickle:
        msg = (
            f"{where} has only pickle weights ({chosen}); pickle files can run code when loaded, so they are "
            f"refused by default. Pass use_pickle=True to load them if you trust the repo, or convert them to "
            f"safetensors."
        )
        raise PickleWeightsError(msg)
    for name in safetensors:
        check_safetensors(os.path.join(folder, name))


def _nested_pickle_files(folder: str) -> list[str]:
    """Pickle files in the folders below ``folder`` (not in it), as paths relative to it."""
    found: list[str] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a symlink loop
            dirnames.clear()
            continue
        seen.add(real)
        dirnames.sort()
        if dirpath == folder:
            continue
        found.extend(
            os.path.relpath(os.path.join(dirpath, name), folder)
            for name in sorted(filenames)
            if name.endswith(_PICKLE)
        )
    return found
