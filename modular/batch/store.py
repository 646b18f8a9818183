"""A batch job's output folder: outputs written atomically, each with a JSON sidecar; finished entries found.

An entry's output ``<name>.png`` (or ``.npy``) and its sidecar ``<name>.png.json`` are each written to
a temporary file ``.<file>.<rank>-<pid>.partial`` in the same folder, flushed to disk and renamed over
the final name (``os.replace``), image first, sidecar last. So a kill at any point leaves, for each
entry, no file, a complete image without a sidecar (it runs again), or both; an entry counts as done
only when its sidecar describes the entry as it is now (its input images' sha256 included) and its
image has the recorded size and sha256; any other output found is made again, and the run says why. A
leftover ``.partial`` file is removed when the job starts again. ``manifest.json``, the job's entries
with their status, is written the same way when every rank has finished.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image

from modular.batch.entries import BatchEntry
from modular.batch.jobfile import JobFileError
from modular.batch.output_folder import unwritable_reason

__all__ = [
    "LOGS",
    "MANIFEST",
    "OutputStore",
    "check_name_lengths",
    "check_writable",
    "encode",
    "library_versions",
]

MANIFEST = "manifest.json"
LOGS = "logs"
PARTIAL = ".partial"
# Room kept in a temporary file's name for its tag "<rank>-<pid>": a rank of up to 8 digits, a pid of up to 7.
TAG_ROOM = 16
_DEFAULT_NAME_MAX = 255  # where the file system does not say (os.pathconf unavailable)
_LIBRARIES = ("modular-pipelines", "torch", "diffusers", "transformers", "accelerate", "numpy", "pillow")


def library_versions() -> dict[str, str | None]:
    """Python's and the libraries' versions, as each output's sidecar records them."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def encode(images: np.ndarray, fmt: str) -> bytes:
    """One image ``[1, H, W, 3]`` (float32 in [0, 1]) as PNG bytes (8 bits, rounded) or ``.npy`` bytes (exact);
    a video family's ``[1, frames, H, W, 3]`` as ``.npy`` only."""
    if images.shape[0] != 1:
        msg = f"a batch entry makes one image (got {images.shape[0]})"
        raise ValueError(msg)
    if images.ndim == 5 and fmt != "npy":
        msg = (
            f"a batch entry made a video ({images.shape[1]} frames of {images.shape[3]}x{images.shape[2]}), which "
            f"cannot be stored as {fmt}; give the job file format: npy"
        )
        raise ValueError(msg)
    buffer = io.BytesIO()
    if fmt == "npy":
        np.save(buffer, images[0].astype(np.float32, copy=False), allow_pickle=False)
    else:
        pixels = (np.clip(images[0], 0.0, 1.0) * 255).round().astype(np.uint8)
        PIL.Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def check_writable(folder: Path) -> None:
    """Check that ``folder`` (or, while it does not exist, the folder that would hold it) takes files.

    Raises:
        PermissionError: it cannot be written (the message says why and what to change).
    """
    problem = unwritable_reason(folder)
    if problem is not None:
        msg = f"output folder '{folder}' is not writable ({problem}); choose another 'output' or fix its permissions"
        raise PermissionError(msg)


def _name_max(folder: Path) -> int:
    """The longest file name the file system of ``folder`` (or the nearest folder above it that exists) takes."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return int(os.pathconf(existing, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return _DEFAULT_NAME_MAX


def check_name_lengths(entries: Iterable[BatchEntry], folder: Path, fmt: str, source: str) -> None:
    """Check that every entry's files, their temporary names included, fit the output folder's file system.

    The longest name an entry writes is its sidecar's temporary file ``.<name>.<fmt>.json.<rank>-<pid>.partial``.

    Raises:
        JobFileError: an entry's name is too long (the first such entry is named, with the count of the rest).
    """
    limit = _name_max(folder)
    too_long = []
    for entry in entries:
        longest = len(f".{entry.name}.{fmt}.json.{PARTIAL}") + TAG_ROOM
        if longest > limit:
            too_long.append((entry, longest))
    if too_long:
        entry, longest = too_long[0]
        more = f" (and {len(too_long) - 1} more entries)" if len(too_long) > 1 else ""
        msg = (
            f"entry {entry.index} writes '{entry.name}.{fmt}', whose temporary sidecar file "
            f"'.{entry.name}.{fmt}.json.<rank>-<pid>{PARTIAL}' may be {longest} characters long, more than the "
            f"{limit} the file system of {folder} takes{more}; shorten 'output_name' or the prompt's 'name'"
        )
        raise JobFileError(source, [msg])


def write_atomically(path: Path, data: bytes, tag: str) -> None:
    """``path`` holds ``data`` or what it held before, never a part: a temporary file ``.NAME.<tag>.partial``
    beside it, flushed and synced, renamed over it, then the folder synced (so the rename survives a crash)."""
    temporary = path.with_name(f".{path.name}.{tag}{PARTIAL}")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:  # interrupted too (Ctrl-C): leave no partial file behind
        temporary.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX: the folder's entry is synced; elsewhere nothing to do)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _json_value(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), for comparing with a sidecar."""
    return json.loads(json.dumps(value))


class OutputStore:
    """The files of one job's output folder.

    Args:
        folder: The output folder (created on first write).
        fmt: ``"png"`` or ``"npy"``.
        tag: Names this process's temporary files (``"<rank>-<pid>"``), so ranks never share one.
    """

    def __init__(self, folder: Path, fmt: str = "png", tag: str | None = None) -> None:
        self.folder = Path(folder)
        self.fmt = fmt
        self.tag = tag or f"0-{os.getpid()}"

    def path(self, entry: BatchEntry) -> Path:
        return self.folder / f"{entry.name}.{self.fmt}"

    def sidecar_path(self, entry: BatchEntry) -> Path:
        return self.folder / f"{entry.name}.{self.fmt}.json"

    @property
    def manifest_path(self) -> Path:
        return self.folder / MANIFEST

    def remove_partial_files(self) -> list[Path]:
        """Remove the temporary files a killed run left; returns them."""
        if not self.folder.is_dir():
            return []
        leftovers = sorted(self.folder.glob(f".*{PARTIAL}"))
        for path in leftovers:
            path.unlink(missing_ok=True)
        return leftovers

    def examine(self, entry: BatchEntry) -> tuple[dict[str, Any] | None, str | None]:
        """``(sidecar, None)`` when the entry's output is complete and made from this same entry; else
        ``(None, why it must be made again)``, or ``(None, None)`` when nothing of it was finished."""
        sidecar_path, path = self.sidecar_path(entry), self.path(entry)
        if not sidecar_path.exists():
            return None, None  # never finished (an image without its sidecar was cut short)
        try:
            sidecar = json.loads(sidecar_path.read_text())
        except (OSError, ValueError) as error:
            return None, f"its sidecar {sidecar_path.name} cannot be read ({type(error).__name__})"
        if not isinstance(sidecar, dict):
            return None, f"its sidecar {sidecar_path.name} is not a JSON object"
        described = _json_value(entry.describe())
        recorded = sidecar.get("entry")
        if recorded != described:
            recorded = recorded if isinstance(recorded, dict) else {}
            changed = sorted(
                key for key in {*described, *recorded} if described.get(key) != recorded.get(key)
            )
            if changed == ["image_sha256"]:
                images = described["image_sha256"]
                keys = sorted(k for k in images if images[k] != recorded.get("image_sha256", {}).get(k))
                return None, f"its input image file(s) {keys} changed since it was made"
            return None, f"the entry changed since its output was made ({', '.join(changed)})"
        try:
            data = path.read_bytes()
        except OSError:
            return None, f"its output {path.name} is missing"
        if len(data) != sidecar.get("bytes") or hashlib.sha256(data).hexdigest() != sidecar.get("sha256"):
            return (
                None,
                f"its output {path.name} does not match the size and sha256 its sidecar recorded (damaged)",
            )
        return sidecar, None

    def finished(self, entry: BatchEntry) -> dict[str, Any] | None:
        """The entry's sidecar when its output is complete and was made from this same entry, else None."""
        return self.examine(entry)[0]

    def resume(self, entries: Iterable[BatchEntry]) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        """The sidecar of every finished entry, and why each output found but not kept is made again, by index."""
        found, redo = {}, {}
        for entry in entries:
            sidecar, reason = self.examine(entry)
            if sidecar is not None:
                found[entry.index] = sidecar
            elif reason is not None:
                redo[entry.index] = reason
        return found, redo

    def scan(self, entries: Iterable[BatchEntry]) -> dict[int, dict[str, Any]]:
        """The sidecar of every finished entry, by index."""
        return self.resume(entries)[0]

    def write(self, entry: BatchEntry, data: bytes, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write the output, then its sidecar (the entry's description, ``record``, size and sha256)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(entry)
        sidecar = {
            "entry": _json_value(entry.describe()),
            "file": path.name,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            **record,
        }
        write_atomically(path, data, self.tag)
        write_atomically(self.sidecar_path(entry), json.dumps(sidecar, indent=1).encode(), self.tag)
        return sidecar

    def _row(self, entry: BatchEntry, status: str, record: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "index": entry.index,
            "name": entry.name,
            "file": self.path(entry).name,
            "sidecar": self.sidecar_path(entry).name,
            "workflow": entry.workflow.name,
            "prompt": entry.prompt.text,
            "seed": entry.seed,
            "size": None if entry.size is None else list(entry.size),
            "status": status,
            "run": record.get("run"),
            "rank": record.get("rank"),
            "seconds": record.get("seconds"),
        }

    def manifest(
        self,
        entries: Iterable[BatchEntry],
        earlier: Mapping[int, Mapping[str, Any]],
        ran: Mapping[int, Mapping[str, Any]],
        head: Mapping[str, Any],
    ) -> dict[str, Any]:
        """``head`` and a row per entry, in index order: ``ran`` in this run or done ``earlier`` (each a
        record with the run, rank and seconds, by index).

        Raises:
            RuntimeError: an entry is in neither (its output is missing).
        """
        rows, missing = [], []
        for entry in entries:
            if entry.index in ran:
                rows.append(self._row(entry, "ran", ran[entry.index]))
            elif entry.index in earlier:
                rows.append(self._row(entry, "earlier", earlier[entry.index]))
            else:
                missing.append(entry.index)
        if missing:
            msg = (
                f"entries {missing} have no output after every rank finished; run the job again to make them"
            )
            raise RuntimeError(msg)
        return {**head, "entries": rows}

    def write_manifest(self, manifest: Mapping[str, Any]) -> Path:
        """Write ``manifest.json`` (atomically, like every output)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomically(self.manifest_path, json.dumps(manifest, indent=1).encode(), self.tag)
        return self.manifest_path
