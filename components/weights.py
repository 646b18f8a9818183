"""Checks on a component folder's weight files before a library reads them."""

from __future__ import annotations

import json
import os
import struct

from .errors import CorruptWeightsError, PickleWeightsError, VariantNotFoundError

__all__ = ["check_weights", "check_safetensors", "file_variant"]

_SAFETENSORS = (".safetensors",)
_PICKLE = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def file_variant(filename: str) -> str | None:
    """The variant a weight file belongs to, from its name.

    ``diffusion_pytorch_model.fp16.safetensors`` -> ``"fp16"``; ``model.fp16-00001-of-00002.safetensors`` ->
    ``"fp16"``; ``model.safetensors`` and ``model-00001-of-00002.safetensors`` -> ``None``.
    """
    parts = filename.split(".")
    if len(parts) <= 2:
        return None
    return parts[-2].split("-")[0]


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


def check_weights(folder: str, where: str, variant: str | None, use_pickle: bool) -> None:
    """Checks a component folder before loading: the variant exists, the format is allowed, files are whole.

    A folder without weight files (a tokenizer, a scheduler) passes.

    Raises:
        VariantNotFoundError: weights exist, but none for ``variant`` (or only variants when none is asked).
        PickleWeightsError: only pickle weights exist for the variant and ``use_pickle`` is False.
        CorruptWeightsError: a safetensors file that would be loaded is truncated.
    """
    names = sorted(os.listdir(folder))
    weights = [name for name in names if name.endswith(_SAFETENSORS + _PICKLE)]
    if not weights:
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
