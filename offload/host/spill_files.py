"""The spill files of one host tier: their names, their removal at close or at exit, and stale ones swept.

A spill file is named ``<model id>-<serial>.<pid>-<host>.safetensors`` and a temporary spill folder
``offload-spill-<pid>-<host>-<random>``: the process that wrote it is in its name. Each ``SpillFiles`` removes
its own files at ``close``, and at interpreter exit or when its tier is garbage-collected if it was never
closed (``weakref.finalize``), so a program that ends without ``disable_auto_cpu_offload()`` leaves nothing.
A process killed outright (``SIGKILL``, a crash) leaves its files: ``sweep_stale`` removes those of
processes of this host that are gone, when a tier is made. Files of a live process, this one's other
managers included, are left alone; so are files of another host sharing the folder (its processes cannot be
seen from here) and every file not named as offload names them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import weakref

import attrs

__all__ = ["SpillFiles", "file_name_part", "process_is_gone", "sweep_stale"]

logger = logging.getLogger("offload.engine.engine")

_TEMPORARY_PREFIX = "offload-spill-"


def file_name_part(text: str) -> str:
    """``text`` (a model id, a device name) as part of a file or folder name: other characters become ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def _owner() -> str:
    """``<pid>-<host>``: which process wrote a file."""
    return f"{os.getpid()}-{_host()}"


# A spill file (or the partial file of a write that was killed) and a temporary spill folder, by their owner.
_FILE = re.compile(r"-[0-9a-f]+\.(?P<pid>\d+)-(?P<host>[A-Za-z0-9_]+)\.safetensors(\.partial)?$")
_FOLDER = re.compile(rf"^{_TEMPORARY_PREFIX}(?P<pid>\d+)-(?P<host>[A-Za-z0-9_]+)-")


def process_is_gone(pid: int) -> bool:
    """Whether no process of this host has id ``pid`` now (never this process; on Windows, where
    ``os.kill(pid, 0)`` would end the process, always False)."""
    if pid == os.getpid() or sys.platform == "win32":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def _gone(match: re.Match[str] | None) -> bool:
    """Whether the owner named in ``match`` is a process of this host that no longer runs."""
    if match is None or match["host"] != _host():
        return False
    return process_is_gone(int(match["pid"]))


def sweep_stale(folder: str | None) -> list[str]:
    """Remove what killed processes of this host left: their spill files in ``folder`` (a spill folder given),
    and their temporary spill folders. Returns what was removed."""
    removed = []
    places = [(tempfile.gettempdir(), True)] + ([(folder, False)] if folder is not None else [])
    for place, temporary in places:
        try:
            entries = os.listdir(place)
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(place, entry)
            try:
                if temporary and _gone(_FOLDER.match(entry)) and os.path.isdir(path):
                    shutil.rmtree(path)
                elif not temporary and _gone(_FILE.search(entry)) and os.path.isfile(path):
                    os.remove(path)
                else:
                    continue
            except OSError:  # removed meanwhile, or not ours to remove: left
                continue
            removed.append(path)
    if removed:
        logger.info(
            "removed %d spill file(s) or folder(s) of processes that are gone: %s", len(removed), removed
        )
    return removed


@attrs.define
class _Owned:
    """What one tier wrote: its files by model id, and the folder when it made it (removed once empty, or
    whole when it is a temporary one). Kept apart from the tier so that its finalizer does not keep it alive."""

    folder: str | None
    temporary: bool  # the folder is a temporary one this tier made: removed whole
    made: bool  # the folder was made by this tier: removed once empty
    paths: dict[str, str] = attrs.field(factory=dict)

    def remove_all(self) -> None:
        for path in self.paths.values():
            for leftover in (path, f"{path}.partial"):
                if os.path.exists(leftover):
                    os.remove(leftover)
        self.paths.clear()
        if self.folder is None:
            return
        if self.temporary:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        elif self.made and os.path.isdir(self.folder) and not os.listdir(self.folder):
            os.rmdir(self.folder)


class SpillFiles:
    """The spill files of one host tier, removed at ``close``, at exit, or when ``owner`` is collected.

    Args:
        owner: The tier; when it is garbage-collected unclosed, its files go with it.
        folder: The spill folder given (made and checked writable by the caller), or ``None`` for a temporary
            one made when first needed.
        made: Whether the caller made ``folder`` (then removed at close once empty).
    """

    def __init__(self, owner: object, folder: str | None, made: bool):
        self._owned = _Owned(folder=folder, temporary=folder is None, made=made)
        self._owner = weakref.ref(owner)
        self._finalizer = weakref.finalize(owner, self._owned.remove_all)  # runs at exit too
        sweep_stale(folder)

    @property
    def folder(self) -> str | None:
        """The folder spill files are written to (``None`` until a temporary one is first needed)."""
        return self._owned.folder

    def paths(self) -> dict[str, str]:
        """The spill file of each model, by model id."""
        return dict(self._owned.paths)

    def path_for(self, model_id: str, serial: int) -> str:
        """Where ``model_id``'s spill file goes (``serial`` tells apart models of one id in other tiers)."""
        owned = self._owned
        if owned.folder is None:
            owned.folder, owned.temporary = tempfile.mkdtemp(prefix=f"{_TEMPORARY_PREFIX}{_owner()}-"), True
        name = file_name_part(model_id)
        return os.path.join(owned.folder, f"{name}-{serial:x}.{_owner()}.safetensors")

    def add(self, model_id: str, path: str) -> None:
        """``path`` was written for ``model_id``: removed at close or exit from now on."""
        self._owned.paths[model_id] = path
        owner = self._owner()
        if not self._finalizer.alive and owner is not None:  # written to again after close
            self._finalizer = weakref.finalize(owner, self._owned.remove_all)

    def forget(self, model_id: str) -> None:
        """Remove ``model_id``'s spill file."""
        path = self._owned.paths.pop(model_id, None)
        if path is not None and os.path.exists(path):
            os.remove(path)

    def close(self) -> None:
        """Remove every spill file, and the folder when it was made here (a temporary one whole, a given one
        once empty)."""
        self._finalizer.detach()
        self._owned.remove_all()
