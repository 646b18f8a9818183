"""Load IDs: ``"<repo>|<subfolder>|<variant>|<revision>"`` and the tag every loaded object carries."""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "LOAD_ID_FIELDS",
    "NULL_LOAD_ID",
    "canonical_load_id",
    "canonical_repo",
    "decode_load_id",
    "format_load_id",
    "get_load_id",
    "tag_load_id",
]

#: The loading fields, in load-ID order.
LOAD_ID_FIELDS = ("pretrained_model_name_or_path", "subfolder", "variant", "revision")
#: The load ID of a component made from a config rather than loaded from a repo.
NULL_LOAD_ID = "null"
# The attribute name the peer (diffusers' modular pipelines) uses, so tagged objects move between the two.
_TAG_ATTRIBUTE = "_diffusers_load_id"


def format_load_id(
    pretrained_model_name_or_path: str | None,
    subfolder: str | None,
    variant: str | None,
    revision: str | None,
) -> str:
    """Joins the four loading fields into a load ID, writing ``null`` for a missing part.

    Example: ``format_load_id("org/name", "unet", "fp16", None) == "org/name|unet|fp16|null"``.
    """
    parts = (pretrained_model_name_or_path, subfolder, variant, revision)
    return "|".join(NULL_LOAD_ID if part is None else str(part) for part in parts)


def canonical_repo(repo: str) -> str:
    """The repo as load IDs name it: a local folder or file by its resolved real path, anything else unchanged.

    ``"tiny-sd"``, ``"./tiny-sd"``, ``"tiny-sd/"``, its absolute path and a link to it are one folder, so they are
    one load ID and its weights load once (tests/components/test_load_id_paths.py). A name that is no local path
    (a hub repo id such as ``"org/name"``) stays as it is; a local path wins, as it does when loading.
    """
    expanded = os.path.expanduser(repo)
    return os.path.realpath(expanded) if os.path.exists(expanded) else repo


def canonical_load_id(load_id: str) -> str:
    """``load_id`` with its repo part named as :func:`canonical_repo` names it (``"null"``, or a string that is
    no load ID, unchanged: it matches nothing either way)."""
    try:
        fields = decode_load_id(load_id)
    except (TypeError, ValueError):
        return load_id
    repo = fields["pretrained_model_name_or_path"]
    if repo is None:
        return load_id
    return format_load_id(canonical_repo(repo), fields["subfolder"], fields["variant"], fields["revision"])


def decode_load_id(load_id: str) -> dict[str, str | None]:
    """Splits a load ID into its loading fields; the inverse of :func:`format_load_id`.

    Args:
        load_id: ``"<repo>|<subfolder>|<variant>|<revision>"`` or ``"null"``.

    Returns:
        ``{"pretrained_model_name_or_path", "subfolder", "variant", "revision"}`` with ``None`` for every
        ``null`` part (all ``None`` for the load ID ``"null"``).

    Raises:
        ValueError: ``load_id`` is not a string of four ``|``-separated parts.
    """
    if not isinstance(load_id, str):
        msg = f"load_id must be a str (got {load_id!r} that is a {type(load_id)})."
        raise TypeError(msg)
    if load_id == NULL_LOAD_ID:
        return dict.fromkeys(LOAD_ID_FIELDS)
    parts = load_id.split("|")
    if len(parts) != len(LOAD_ID_FIELDS):
        msg = (
            f"load_id must have {len(LOAD_ID_FIELDS)} parts '<repo>|<subfolder>|<variant>|<revision>' or be "
            f"'null' (got {load_id!r} with {len(parts)} part(s))."
        )
        raise ValueError(msg)
    return {field: (None if part == NULL_LOAD_ID else part) for field, part in zip(LOAD_ID_FIELDS, parts)}


def tag_load_id(obj: Any, load_id: str) -> None:
    """Tags ``obj`` with its load ID (as ``obj._diffusers_load_id``, readable by the peer too)."""
    decode_load_id(load_id)  # validates
    try:
        setattr(obj, _TAG_ATTRIBUTE, load_id)
    except (AttributeError, TypeError) as error:
        msg = (
            f"Cannot tag a {type(obj).__name__} with load_id {load_id!r}: it does not accept new attributes "
            f"({error}). Wrap it in an object that does, or register it without a load ID."
        )
        raise TypeError(msg) from error


def get_load_id(obj: Any) -> str | None:
    """Returns the load ID ``obj`` was tagged with, or ``None`` when it carries none."""
    value = getattr(obj, _TAG_ATTRIBUTE, None)
    return value if isinstance(value, str) else None
