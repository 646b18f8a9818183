"""Where a block repo's code comes from: a local folder or a pinned hub revision, read once and hashed."""

from __future__ import annotations

import hashlib
import os
import re

import attrs
from huggingface_hub import constants

from components.errors import RepoNotFoundError, SubfolderOutsideRepoError
from components.repo import download_snapshot, subfolder_escape
from modular.errors import BlockRepoError
from modular.remote.code_files import read_regular_file

__all__ = ["CONFIG_NAME", "BlockSource", "RepoSnapshot", "read_repo"]

#: The file that names a block repo's code, as the peer writes it.
CONFIG_NAME = "modular_config.json"

_REPO_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@attrs.frozen
class BlockSource:
    """Where a block loaded with ``ModularPipelineBlocks.from_pretrained`` came from (``block.source``).

    Attributes:
        repo: The hub repo id, or the absolute path of the local folder.
        revision: The revision asked for (``None``: the default branch; always ``None`` for a folder).
        commit: The hub commit the code was read from; ``None`` for a local folder.
        content_hash: sha256 over ``modular_config.json`` and the ``.py`` files the code runs (the module
            ``auto_map`` names and what it imports relatively), as read.
        code_file: The file that defines the class, relative to the repo (``"block.py"``).
        class_name: The block's class name.
        subfolder: The folder inside the repo that holds the block (``""``: the root).
    """

    repo: str
    revision: str | None
    commit: str | None
    content_hash: str
    code_file: str
    class_name: str
    subfolder: str = ""


@attrs.frozen
class RepoSnapshot:
    """The files of one block repo, read from disk once: what is hashed is what runs.

    Attributes:
        repo: As :attr:`BlockSource.repo`.
        revision: As asked.
        commit: The hub commit, ``None`` for a local folder.
        folder: The local folder the files were read from (a hub snapshot folder for a repo id).
        config: The bytes of ``modular_config.json``, ``None`` when the repo has none.
        files: ``relative/path.py -> bytes`` of the Python files the code runs; empty until consent was checked
            and ``modular/remote/code_files.py`` read them.
        where: Names the repo in messages: ``"Block repo 'org/name' (revision 'v2', commit 1a2b...)"``.
    """

    repo: str
    revision: str | None
    commit: str | None
    folder: str
    config: bytes | None
    files: dict[str, bytes]
    where: str

    @property
    def content_hash(self) -> str:
        digest = hashlib.sha256()
        for name, data in sorted({CONFIG_NAME: self.config or b"", **self.files}.items()):
            digest.update(f"{name}\0{len(data)}\0".encode())
            digest.update(data)
        return digest.hexdigest()


def _hub_snapshot(
    repo: str,
    revision: str | None,
    subfolder: str,
    *,
    token: str | bool | None,
    cache_dir: str | os.PathLike | None,
    local_files_only: bool,
) -> str:
    # Only the config and the code: a repo that also holds weights is not downloaded whole.
    prefix = f"{subfolder}/" if subfolder else ""
    return download_snapshot(
        repo,
        revision,
        where=f"block repo {repo!r}",
        allow_patterns=[f"{prefix}{CONFIG_NAME}", f"{prefix}*.py"],
        token=token,
        local_files_only=local_files_only,
        cache_dir=cache_dir,
    )


def read_repo(
    repo: str | os.PathLike,
    revision: str | None = None,
    subfolder: str = "",
    *,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> RepoSnapshot:
    """Read a block repo's config from a local folder or a hub revision; no code file is read yet.

    Raises:
        BlockRepoError: ``revision`` given for a local folder (a folder has no revisions to pin).
        SubfolderOutsideRepoError: ``subfolder`` is absolute or climbs out with ``..``.
        RepoNotFoundError: neither a folder nor a hub repo (cached, when offline).
        RevisionNotFoundError: the hub repo has no such revision.
    """
    name = os.fspath(repo)
    escape = subfolder_escape(subfolder or "")
    if escape is not None:
        msg = f"Block repo {name!r}: subfolder {subfolder!r} must be a folder inside the repo, but {escape}."
        raise SubfolderOutsideRepoError(msg)
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        if revision is not None:
            msg = (
                f"Block folder {os.path.abspath(expanded)!r} is a local folder, which has no revisions, so "
                f"revision={revision!r} cannot be honoured. Drop revision=, or pass the hub repo id to pin one."
            )
            raise BlockRepoError(msg)
        root, label, commit = os.path.abspath(expanded), os.path.abspath(expanded), None
        where = f"Block folder {label!r}"
    elif _REPO_ID.match(name):
        snapshot = _hub_snapshot(
            name, revision, subfolder, token=token, cache_dir=cache_dir, local_files_only=local_files_only
        )
        root, label = snapshot, name
        # huggingface_hub names each snapshot folder by its commit hash.
        commit = os.path.basename(os.path.normpath(snapshot))
        commit = commit if _COMMIT.match(commit) else None
        where = f"Block repo {name!r} (revision {revision or constants.DEFAULT_REVISION!r}, commit {commit})"
    else:
        msg = (
            f"Block repo {name!r}: no such local folder ({os.path.abspath(expanded)}), and not a hub repo id."
        )
        raise RepoNotFoundError(msg)
    folder = os.path.join(root, subfolder) if subfolder else root
    if subfolder:
        where = f"{where}, subfolder {subfolder!r}"
    config_path = os.path.join(folder, CONFIG_NAME)
    config = read_regular_file(config_path, where) if os.path.lexists(config_path) else None
    return RepoSnapshot(
        repo=label, revision=revision, commit=commit, folder=folder, config=config, files={}, where=where
    )
