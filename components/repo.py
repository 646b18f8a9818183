"""Finding a component's files: a local folder, or a hub repo id through huggingface_hub's cache."""

from __future__ import annotations

import difflib
import ntpath
import os
import posixpath
import re

import attrs
from huggingface_hub import constants, snapshot_download
from huggingface_hub import errors as hub_errors
from huggingface_hub.file_download import repo_folder_name

from .errors import (
    RepoNotFoundError,
    RevisionNotFoundError,
    SubfolderNotFoundError,
    SubfolderOutsideRepoError,
)

__all__ = [
    "Location",
    "describe",
    "download_snapshot",
    "mistyped_folder",
    "resolve_location",
    "subfolder_escape",
]

# Weight formats we never need: skipping them keeps a hub fetch to the component's own files.
_FOREIGN_FORMATS = ["*.msgpack", "*.h5", "*.onnx", "*.onnx_data", "*.tflite", "*.ot", "*.gguf"]
_PICKLE_FORMATS = ["*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl"]


def describe(repo: str | None, subfolder: str, variant: str | None, revision: str | None) -> str:
    """Names a component's location for error messages: ``'org/name' (subfolder 'unet', variant 'fp16')``."""
    details = [f"subfolder {subfolder!r}" if subfolder else "no subfolder"]
    if variant is not None:
        details.append(f"variant {variant!r}")
    if revision is not None:
        details.append(f"revision {revision!r}")
    return f"{repo!r} ({', '.join(details)})"


def subfolder_escape(subfolder: str) -> str | None:
    """Why ``subfolder`` would lead outside its repo, or ``None`` when it stays inside.

    A subfolder is a relative path below the repo root: an absolute path (POSIX or Windows, a drive such as
    ``C:`` included) or a ``..`` part (with ``/`` or ``\\`` as separator) leaves the repo.
    """
    drive = ntpath.splitdrive(subfolder)[0]
    if drive and not drive.startswith(("/", "\\")):
        return f"it names a drive ({drive!r})"
    if posixpath.isabs(subfolder) or ntpath.isabs(subfolder):
        return "it is an absolute path"
    if ".." in re.split(r"[/\\]", subfolder):
        return "it has a '..' part"
    return None


@attrs.frozen
class Location:
    """Where a component's files are on local disk.

    Attributes:
        root: The repo's local root (a folder, or a hub snapshot folder).
        folder: ``root`` joined with the subfolder.
        from_hub: Whether ``root`` came from the hub cache.
    """

    root: str
    folder: str
    from_hub: bool


# "name" or "org/name": what the hub accepts as a model repo id.
_REPO_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)?$")


def mistyped_folder(repo: str) -> str | None:
    """``"no such folder <path> (did you mean ...)"`` when a repo id the hub does not give is likely a local
    folder typed wrong: its parent folder exists (``out/tiny-sd`` beside an ``out`` folder), or a folder of a
    close name is where it points; ``None`` when nothing local suggests it (a bare hub id).
    """
    expanded = os.path.expanduser(repo)
    parent = os.path.dirname(expanded)
    listed = parent or "."
    names = (
        sorted(n for n in os.listdir(listed) if os.path.isdir(os.path.join(listed, n)))
        if os.path.isdir(listed)
        else []
    )
    close = difflib.get_close_matches(os.path.basename(expanded), names, n=1, cutoff=0.8)
    if not (parent and os.path.isdir(parent)) and not close:
        return None
    hint = f" (did you mean {os.path.join(parent, close[0])!r}?)" if close else ""
    return f"no such folder {os.path.abspath(expanded)}{hint}"


def download_snapshot(
    repo: str,
    revision: str | None,
    *,
    where: str,
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> str:
    """The local folder of a hub repo's revision (only the files the patterns select), through huggingface_hub.

    Respects the cache and offline mode; its errors become ours, naming ``where`` and the fix.

    Raises:
        RepoNotFoundError: not on the hub (or not cached when offline), or gated without a token.
        RevisionNotFoundError: the repo is there but the revision is not (the cached refs are listed).
    """
    offline = local_files_only or constants.HF_HUB_OFFLINE
    cache = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
    try:
        return snapshot_download(
            repo,
            revision=revision,
            allow_patterns=allow_patterns,
            ignore_patterns=ignore_patterns,
            cache_dir=cache,
            token=token,
            local_files_only=offline,
        )
    except hub_errors.RevisionNotFoundError as error:
        msg = (
            f"Revision {revision!r} does not exist in {where} on the hub. Use a branch, tag or commit it has."
        )
        raise RevisionNotFoundError(msg) from error
    except (hub_errors.RepositoryNotFoundError, hub_errors.GatedRepoError) as error:
        msg = (
            f"Repo {where} was not found on the hub, or needs access rights: {error}. Check the id, or pass "
            f"token=... for a private or gated repo."
        )
        raise RepoNotFoundError(msg) from error
    except hub_errors.LocalEntryNotFoundError as error:
        storage = os.path.join(cache, repo_folder_name(repo_id=repo, repo_type="model"))
        reason = (
            "offline mode (HF_HUB_OFFLINE=1 or local_files_only=True)"
            if offline
            else "the hub cannot be reached"
        )
        if not os.path.isdir(storage):
            folder = mistyped_folder(repo)
            if folder is not None:
                msg = f"Repo {where}: {folder}; check the path (as a hub repo id it is not cached, and {reason})."
                raise RepoNotFoundError(msg) from error
            msg = (
                f"Repo {where} is neither a local folder nor in the hub cache at {cache}, and {reason} forbids "
                f"downloading it. Check the id, download it once online (`hf download {repo}`), or pass the "
                f"path of a local folder."
            )
            raise RepoNotFoundError(msg) from error
        refs_dir = os.path.join(storage, "refs")
        snaps_dir = os.path.join(storage, "snapshots")
        refs = sorted(os.listdir(refs_dir)) if os.path.isdir(refs_dir) else []
        snaps = sorted(os.listdir(snaps_dir)) if os.path.isdir(snaps_dir) else []
        msg = (
            f"Revision {revision or constants.DEFAULT_REVISION!r} of {where} is not in the hub cache at {cache}, "
            f"and {reason} forbids fetching it. Cached refs: {refs}; cached commits: {snaps}. Use one of those, "
            f"or fetch the revision online first."
        )
        raise RevisionNotFoundError(msg) from error


def resolve_location(
    repo: str,
    subfolder: str,
    variant: str | None,
    revision: str | None,
    *,
    token: str | bool | None = None,
    local_files_only: bool = False,
    cache_dir: str | os.PathLike | None = None,
    use_pickle: bool = False,
) -> Location:
    """Finds (fetching if allowed) the files of one component.

    A local folder is used as it is. Anything else is a hub repo id, resolved through huggingface_hub:
    only ``<subfolder>/*`` is fetched, the cache and offline mode are respected, and ``token`` is passed on.

    Raises:
        SubfolderOutsideRepoError: the subfolder is absolute or has a ``..`` part.
        RepoNotFoundError: not a folder, and not on the hub (or not cached when offline).
        RevisionNotFoundError: the repo is there but the revision is not.
        SubfolderNotFoundError: the repo has no such subfolder.
    """
    where = describe(repo, subfolder, variant, revision)
    escape = subfolder_escape(subfolder)
    if escape is not None:
        msg = (
            f"Repo {where}: the subfolder must be a folder inside the repo, but {escape}. Give the folder that "
            f"holds the component as the repo (pretrained_model_name_or_path) and a subfolder inside it."
        )
        raise SubfolderOutsideRepoError(msg)
    expanded = os.path.expanduser(repo)
    if os.path.isdir(expanded):
        root, from_hub = expanded, False
    elif not _REPO_ID.match(repo):
        msg = (
            f"Repo {where}: no such local folder ({os.path.abspath(expanded)}), and it is not a hub repo id."
        )
        raise RepoNotFoundError(msg)
    else:
        root = download_snapshot(
            repo,
            revision,
            where=where,
            allow_patterns=[f"{subfolder}/*"] if subfolder else None,
            ignore_patterns=_FOREIGN_FORMATS + ([] if use_pickle else _PICKLE_FORMATS),
            token=token,
            local_files_only=local_files_only,
            cache_dir=cache_dir,
        )
        from_hub = True
    folder = os.path.join(root, subfolder) if subfolder else root
    inside = os.path.normpath(os.path.abspath(root))
    if os.path.commonpath([inside, os.path.normpath(os.path.abspath(folder))]) != inside:
        # subfolder_escape refuses every way out we know of; this guards the join itself.
        msg = f"Repo {where}: subfolder {subfolder!r} resolves to {folder}, outside the repo at {root}."
        raise SubfolderOutsideRepoError(msg)
    if not os.path.isdir(folder):
        present = sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)))
        msg = (
            f"Repo {where} has no subfolder {subfolder!r} (subfolders present: {present}). Fix the spec's "
            f"subfolder, or pass subfolder=... to load()."
        )
        raise SubfolderNotFoundError(msg)
    return Location(root=root, folder=folder, from_hub=from_hub)
