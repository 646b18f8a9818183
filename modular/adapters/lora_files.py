"""Where a LoRA comes from: a state dict, a file, a folder or a hub repo, found through the project's repo loading.

The file is found here (a folder or a hub snapshot resolved by ``components.repo.resolve_location``, so revision,
offline mode, the cache and the token behave as for components) and checked before diffusers reads it:
safetensors only unless ``use_pickle=True``, a truncated file refused. diffusers then reads the one local file.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import torch

from components.errors import MissingComponentFileError, PickleWeightsError
from components.repo import resolve_location
from components.weights import PICKLE_SUFFIXES, check_weight_file

__all__ = ["HUB_OPTIONS", "LoraSource", "find_lora"]

#: The keywords ``load_lora_weights`` passes on to the repo loading.
HUB_OPTIONS = ("subfolder", "revision", "token", "local_files_only", "cache_dir", "use_pickle")

# The file diffusers' ``save_lora_weights`` writes; preferred when a folder holds several.
_DEFAULT_NAME = "pytorch_lora_weights.safetensors"


@attrs.frozen
class LoraSource:
    """What a diffusers LoRA loader is given: an in-memory state dict, or one local file.

    Attributes:
        state_dict: The caller's state dict (a shallow copy), or ``None`` for a file.
        folder: The folder holding the file.
        weight_name: The file's name in ``folder``.
    """

    state_dict: dict[str, torch.Tensor] | None = None
    folder: str | None = None
    weight_name: str | None = None

    def loader_arguments(self) -> tuple[Any, dict[str, Any]]:
        """The first argument and the keywords for a mixin's ``load_lora_weights`` / ``lora_state_dict``."""
        if self.state_dict is not None:
            return dict(self.state_dict), {}
        assert self.weight_name is not None  # a file source always has its name
        options = {"weight_name": self.weight_name, "local_files_only": True}
        # diffusers tries safetensors first; a pickle file was allowed by the caller (use_pickle=True).
        options["use_safetensors"] = self.weight_name.endswith(".safetensors")
        return self.folder, options

    def describe(self) -> str:
        """The source in a message: ``'a state dict'`` or the file's path."""
        if self.state_dict is not None:
            return "a state dict"
        return os.path.join(self.folder or "", self.weight_name or "")


def find_lora(source: Any, weight_name: str | None, hub_options: dict[str, Any]) -> LoraSource:
    """The LoRA named by ``source`` (a state dict, a ``.safetensors`` file, a folder or a hub repo id).

    Args:
        source: What ``load_lora_weights`` was given.
        weight_name: The file in the folder or repo; ``None``: its only LoRA file (or diffusers' default name).
        hub_options: Keywords among ``HUB_OPTIONS``.

    Raises:
        TypeError: ``source`` is of another type, a state dict holds something else than tensors, or an unknown
            keyword.
        ValueError: ``weight_name`` given with a file path; several candidate files and no ``weight_name``.
        MissingComponentFileError: the file is not there, or the folder holds no LoRA file.
        PickleWeightsError: a pickle file without ``use_pickle=True``.
        CorruptWeightsError: a truncated safetensors file.
        RepoNotFoundError, RevisionNotFoundError, SubfolderNotFoundError: as for components.
    """
    unknown = sorted(set(hub_options) - set(HUB_OPTIONS))
    if unknown:
        msg = f"load_lora_weights() got unknown keyword(s) {unknown}; it accepts {list(HUB_OPTIONS)}"
        raise TypeError(msg)
    if isinstance(source, dict):
        return LoraSource(state_dict=_checked_state_dict(source))
    if not isinstance(source, (str, os.PathLike)):
        msg = (
            "load_lora_weights() takes a state dict, a .safetensors file, a folder or a hub repo id "
            f"(got a {type(source).__name__})"
        )
        raise TypeError(msg)
    use_pickle = bool(hub_options.get("use_pickle", False))
    path = os.path.expanduser(os.fspath(source))
    if os.path.isfile(path):
        if weight_name is not None:
            msg = (
                f"load_lora_weights({path!r}, weight_name={weight_name!r}): the path is a file already; pass "
                "the file alone, or its folder with weight_name"
            )
            raise ValueError(msg)
        folder, name = os.path.split(path)
        return _checked_file(folder or ".", name, use_pickle)
    location = resolve_location(
        os.fspath(source),
        hub_options.get("subfolder") or "",
        None,
        hub_options.get("revision"),
        token=hub_options.get("token"),
        local_files_only=bool(hub_options.get("local_files_only", False)),
        cache_dir=hub_options.get("cache_dir"),
        use_pickle=use_pickle,
    )
    name = weight_name if weight_name is not None else _only_lora_file(location.folder, use_pickle)
    return _checked_file(location.folder, name, use_pickle)


def _checked_state_dict(state_dict: dict) -> dict[str, torch.Tensor]:
    wrong = [
        key for key, value in state_dict.items() if not isinstance(key, str) or not torch.is_tensor(value)
    ]
    if wrong:
        msg = f"load_lora_weights(): a state dict maps parameter names to tensors (not so for {wrong[:3]})"
        raise TypeError(msg)
    if not state_dict:
        msg = "load_lora_weights(): the state dict is empty"
        raise ValueError(msg)
    return dict(state_dict)


def _only_lora_file(folder: str, use_pickle: bool) -> str:
    """The LoRA file of a folder given without ``weight_name``."""
    names = sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name)))
    safetensors = [name for name in names if name.endswith(".safetensors")]
    pickles = [name for name in names if name.endswith(PICKLE_SUFFIXES)]
    candidates = safetensors or (pickles if use_pickle else [])
    if not candidates:
        if pickles:
            msg = (
                f"{folder} holds only pickle LoRA files ({pickles}); pickle files can run code when loaded, so "
                "they are refused by default. Pass use_pickle=True if you trust them, or convert them to "
                "safetensors."
            )
            raise PickleWeightsError(msg)
        msg = f"{folder} holds no LoRA file (*.safetensors); files present: {names}. Pass weight_name=..."
        raise MissingComponentFileError(msg)
    if len(candidates) == 1:
        return candidates[0]
    if _DEFAULT_NAME in candidates:
        return _DEFAULT_NAME
    msg = f"{folder} holds several LoRA files ({candidates}); pass weight_name= with the one to load"
    raise ValueError(msg)


def _checked_file(folder: str, name: str, use_pickle: bool) -> LoraSource:
    check_weight_file(folder, name, use_pickle=use_pickle, what="LoRA", where=f"LoRA folder {folder}")
    return LoraSource(folder=folder, weight_name=name)
