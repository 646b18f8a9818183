"""Builds a local huggingface_hub cache, laid out as huggingface_hub lays it out, for offline hub-id tests.

``<cache>/models--org--name/blobs/<sha256>``, ``snapshots/<commit>/<path>`` (relative symlinks to the blobs)
and ``refs/<ref>`` holding the commit hash. With ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` (or ``cache_dir=``)
pointing at it, ``snapshot_download(repo_id, revision=ref or commit)`` resolves to the snapshot folder.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["add_to_hub_cache", "repo_cache_folder"]


def repo_cache_folder(cache_dir: str | os.PathLike, repo_id: str) -> Path:
    """The cache folder of a model repo: ``<cache>/models--org--name``."""
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def add_to_hub_cache(
    cache_dir: str | os.PathLike,
    repo_id: str,
    source: str | os.PathLike,
    ref: str = "main",
    commit: str | None = None,
) -> str:
    """Adds every file under ``source`` as one commit of ``repo_id`` in the cache, and points ``ref`` at it.

    Args:
        cache_dir: The hub cache folder (what ``HF_HUB_CACHE`` names).
        repo_id: ``"org/name"``.
        source: A folder laid out as the repo (e.g. written by ``make_tiny_repo``).
        ref: The branch or tag to point at the commit (``refs/<ref>``); ``None`` for none.
        commit: The 40-hex commit hash; by default derived from the files and the ref.

    Returns:
        The commit hash.
    """
    source = Path(source)
    storage = repo_cache_folder(cache_dir, repo_id)
    files = sorted(path for path in source.rglob("*") if path.is_file())
    blobs = {}
    for path in files:
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        blob = storage / "blobs" / digest
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
        blobs[path.relative_to(source).as_posix()] = digest
    if commit is None:
        listing = "\n".join(f"{name} {digest}" for name, digest in blobs.items())
        commit = hashlib.sha1(f"{repo_id}\n{ref}\n{listing}".encode()).hexdigest()
    snapshot = storage / "snapshots" / commit
    for name, digest in blobs.items():
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        # Relative links, as huggingface_hub makes them: ../../blobs/<digest> from the snapshot root.
        link.symlink_to(os.path.relpath(storage / "blobs" / digest, link.parent))
    if ref is not None:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return commit
