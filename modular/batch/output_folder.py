"""Whether a folder can take a command's output files, checked before anything loads or runs."""

from __future__ import annotations

import uuid
from pathlib import Path

__all__ = ["PROBE_SUFFIX", "unwritable_reason"]

PROBE_SUFFIX = ".partial"  # the probe reads as a temporary file; a batch job's start removes leftovers


def unwritable_reason(folder: Path) -> str | None:
    """Why files cannot be written into ``folder`` (made if missing), or ``None`` when they can.

    ``folder`` itself, or the nearest folder above it that exists, must be a folder that takes a file: a file
    in its place or above it, or no permission (found by writing an empty probe file, so it holds for root and
    ACLs alike), is the reason.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    probe = existing / f".modular-probe-{uuid.uuid4().hex}{PROBE_SUFFIX}"
    try:
        probe.write_bytes(b"")
        probe.unlink(missing_ok=True)
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
    return None
