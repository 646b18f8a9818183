"""The keywords of ``save_pretrained``, as the peer's: how weights are written, whether the index points at the
saved folder, and an upload to the hub (through huggingface_hub) after the save.

Every keyword is checked before anything is written or created; an unknown one is an error, not ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import huggingface_hub

from modular.pipeline.index import MODULAR_INDEX

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["SaveOptions", "HubUpload", "hub_upload", "save_pretrained"]

_SIZE = re.compile(r"\d+(\.\d+)?\s*[KMGT]B", re.IGNORECASE)


def _check_variant(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value or "/" in value or "\\" in value):
        msg = f"save_pretrained: variant must be a name like 'fp16', or None (got {value!r})"
        raise ValueError(msg)


def _check_size(instance: Any, attribute: Any, value: Any) -> None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return
    if isinstance(value, str) and _SIZE.fullmatch(value.strip()):
        return
    msg = f"save_pretrained: max_shard_size must be a byte count above 0 or a size like '5GB' (got {value!r})"
    raise ValueError(msg)


def _check_bool(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, bool):
        msg = f"save_pretrained: {attribute.name} must be True or False (got {value!r})"
        raise TypeError(msg)


@attrs.frozen
class SaveOptions:
    """How ``save_pretrained`` writes a pipeline.

    Attributes:
        safe_serialization: safetensors (the default); ``False`` writes pickle files where a component's save
            offers them (reading them back needs ``use_pickle=True``).
        variant: weights are written as ``<weights>.<variant>.safetensors`` by the components whose save
            takes a variant (models); their index entries record it.
        max_shard_size: weights larger than this (bytes, or ``"5GB"``) are written in shards.
        overwrite_modular_index: ``True`` points each saved component's entry at the saved folder. ``False``
            keeps the recorded source of every component that has one and writes no weights for it (nothing
            would read them): an index that references other repos. A component without a source (made in
            memory) is written either way.
    """

    safe_serialization: bool = attrs.field(default=True, validator=_check_bool)
    variant: str | None = attrs.field(default=None, validator=_check_variant)
    max_shard_size: int | str | None = attrs.field(default=None, validator=_check_size)
    overwrite_modular_index: bool = attrs.field(default=True, validator=_check_bool)

    def weight_options(self) -> dict[str, Any]:
        """The keywords for a component's own ``save_pretrained`` (each passed only where it is taken)."""
        return {
            "safe_serialization": self.safe_serialization,
            "variant": self.variant,
            "max_shard_size": self.max_shard_size,
        }


_optional_str = attrs.validators.optional(attrs.validators.instance_of(str))


@attrs.frozen
class HubUpload:
    """Where ``save_pretrained(..., push_to_hub=True)`` uploads the saved folder, and how (huggingface_hub's
    ``create_repo`` and ``upload_folder`` keywords)."""

    repo_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    commit_message: str | None = attrs.field(default=None, validator=_optional_str)
    private: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool))
    )
    create_pr: bool = attrs.field(default=False, validator=_check_bool)
    token: str | bool | None = None

    def create_repo(self) -> str:
        """Create the repo if it does not exist; return its full id (``user/name``)."""
        api = huggingface_hub.HfApi(token=self.token)
        return api.create_repo(self.repo_id, private=self.private, exist_ok=True).repo_id

    def upload(self, repo_id: str, folder: Path, index: dict[str, Any]) -> None:
        """Upload the index and the component folders it names as its own (``null`` source) to ``repo_id``."""
        # Only what the index reads from this folder: other files a user keeps there stay local.
        own = [entry[2]["subfolder"] for entry in index.values() if _is_own_entry(entry)]
        huggingface_hub.HfApi(token=self.token).upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            allow_patterns=[MODULAR_INDEX, *(f"{subfolder}/**" for subfolder in own)],
            commit_message=self.commit_message or "Upload modular pipeline",
            create_pr=self.create_pr,
        )


def _is_own_entry(entry: Any) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 3
        and isinstance(entry[2], dict)
        and entry[2].get("pretrained_model_name_or_path") is None
        and bool(entry[2].get("subfolder"))
    )


_HUB_KEYWORDS = ("repo_id", "commit_message", "private", "create_pr", "token")


def hub_upload(
    save_directory: str | os.PathLike, push_to_hub: bool, keywords: dict[str, Any]
) -> HubUpload | None:
    """The upload the keywords ask for (``None``: no upload); refuses unknown keywords and an offline hub."""
    unknown = sorted(set(keywords) - set(_HUB_KEYWORDS))
    if unknown:
        known = ["safe_serialization", "variant", "max_shard_size", "push_to_hub", "overwrite_modular_index"]
        msg = f"save_pretrained: unknown keyword(s) {unknown}; it takes {known + list(_HUB_KEYWORDS)}"
        raise TypeError(msg)
    if not isinstance(push_to_hub, bool):
        msg = f"save_pretrained: push_to_hub must be True or False (got {push_to_hub!r})"
        raise TypeError(msg)
    if not push_to_hub:
        if keywords:
            msg = f"save_pretrained: {sorted(keywords)} only apply to an upload; pass push_to_hub=True, or drop them"
            raise TypeError(msg)
        return None
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        msg = (
            "save_pretrained: push_to_hub=True needs the hub, but it is offline (HF_HUB_OFFLINE=1); save "
            "without push_to_hub and upload the folder later (huggingface_hub.upload_folder), or unset "
            "HF_HUB_OFFLINE"
        )
        raise ConnectionError(msg)
    repo_id = keywords.pop("repo_id", None) or Path(save_directory).resolve().name
    return HubUpload(repo_id, **keywords)


def save_pretrained(
    pipe: ModularPipeline,
    save_directory: str | os.PathLike,
    safe_serialization: bool = True,
    variant: str | None = None,
    max_shard_size: int | str | None = None,
    push_to_hub: bool = False,
    **keywords: Any,
) -> None:
    """Check every keyword, create the hub repo (with ``push_to_hub``), save, then upload: a bad keyword or a
    refused repo leaves the folder as it was."""
    from modular.pipeline.saving import check_save_target, save_pipeline

    overwrite = keywords.pop("overwrite_modular_index", True)
    options = SaveOptions(safe_serialization, variant, max_shard_size, overwrite)
    check_save_target(save_directory)
    upload = hub_upload(save_directory, push_to_hub, keywords)
    repo_id = upload.create_repo() if upload is not None else None
    index = save_pipeline(pipe, save_directory, options)
    if upload is not None and repo_id is not None:
        upload.upload(repo_id, Path(save_directory).resolve(), index)
