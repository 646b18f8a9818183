"""The keywords a load takes: which set load-ID fields (``repo`` is an alias), which are load options."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from .load_id import LOAD_ID_FIELDS

__all__ = ["LOAD_OPTIONS", "PASSED_ON_OPTIONS", "REPO_ALIAS", "SOURCE_OPTIONS", "split_load_kwargs"]

#: Accepted for ``pretrained_model_name_or_path``.
REPO_ALIAS = "repo"
#: Options that find the files: used to resolve the repo, not passed on to ``from_pretrained``.
SOURCE_OPTIONS = ("token", "local_files_only", "cache_dir")
#: Options passed on as given to a model's ``from_pretrained`` (tokenizers and schedulers take none).
PASSED_ON_OPTIONS = ("quantization_config", "device_map", "low_cpu_mem_usage")
#: Every keyword a load accepts besides the loading fields (and ``repo``).
LOAD_OPTIONS = (
    "torch_dtype",
    "dtype",
    "quantization_config",
    "token",
    "local_files_only",
    "use_pickle",
    "trust_remote_code",
    "cache_dir",
    "device_map",
    "low_cpu_mem_usage",
    "config",  # a single checkpoint file's config (components/single_file.py)
)
_ACCEPTED = (*LOAD_ID_FIELDS, REPO_ALIAS, *LOAD_OPTIONS)


def _path_str(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def split_load_kwargs(kwargs: Mapping[str, Any], caller: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Splits the keywords of a load into load-ID field overrides and load options.

    ``repo`` becomes ``pretrained_model_name_or_path``. The caller evolves its spec with the first dict
    and reads the second.

    Args:
        kwargs: The keywords, e.g. ``{"repo": "org/x", "variant": "fp16", "torch_dtype": torch.float16}``.
        caller: Names the call in errors, e.g. ``"ComponentSpec.load() for 'unet'"``.

    Returns:
        ``(fields, options)``: ``{"pretrained_model_name_or_path": "org/x", "variant": "fp16"}`` and
        ``{"torch_dtype": torch.float16}`` for the example.

    Raises:
        TypeError: an unknown keyword; the message names the closest accepted one.
        ValueError: ``repo`` and ``pretrained_model_name_or_path`` are both given and differ.
    """
    unknown = [key for key in kwargs if key not in _ACCEPTED]
    if unknown:
        hints = {key: difflib.get_close_matches(key, _ACCEPTED, n=1) for key in sorted(unknown)}
        detail = ", ".join(
            f"{key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "") for key, hint in hints.items()
        )
        msg = f"{caller} got unknown keyword(s) {detail}. Accepted: {list(_ACCEPTED)}."
        raise TypeError(msg)
    fields = {key: kwargs[key] for key in LOAD_ID_FIELDS if key in kwargs}
    if REPO_ALIAS in kwargs:
        repo = kwargs[REPO_ALIAS]
        given = fields.get("pretrained_model_name_or_path")
        if given is not None and _path_str(given) != _path_str(repo):
            msg = (
                f"{caller}: repo ({repo!r}) and pretrained_model_name_or_path ({given!r}) disagree; repo is an "
                "alias, pass one of them."
            )
            raise ValueError(msg)
        fields["pretrained_model_name_or_path"] = repo
    options = {key: value for key, value in kwargs.items() if key in LOAD_OPTIONS}
    return fields, options
