"""The server's durable record of jobs: one SQLite file (Python's own ``sqlite3``), written before a client is answered.

Each accepted job is one row: its id, arrival number, state, priority, the request in normal form (JSON),
its timings, error, and the result files written so far. A job is committed (``synchronous=FULL``) before
``add`` returns, so a job the client was told about survives a ``kill -9``. After a crash, ``recover`` puts every
job that was running back in the queue (its results already written are kept; it runs the rest, to the
same file names), so no accepted job is lost and none runs twice to a second result file.

Result files are written by ``write_result`` under names the server makes (``<job id>-<index>.png``): a
temporary file, flushed and synced, renamed over the name, before the row records it. A writer killed
mid-write leaves its temporary file; ``remove_partials`` removes those of processes gone, at a server's start.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from modular.batch.store import write_atomically
from offload.host.spill_files import process_is_gone

__all__ = [
    "STATES",
    "JobRecord",
    "JobStore",
    "StateFolderInUseError",
    "hold_state_folder",
    "remove_partials",
    "write_result",
]

STATES = ("queued", "running", "done", "failed", "cancelled")
FINAL = frozenset({"done", "failed", "cancelled"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    state TEXT NOT NULL,
    workflow TEXT NOT NULL,
    priority INTEGER NOT NULL,
    request TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    error TEXT,
    results TEXT NOT NULL DEFAULT '[]',
    attempts INTEGER NOT NULL DEFAULT 0
)
"""


@attrs.define
class JobRecord:
    """One job as the store holds it. Times are seconds since the epoch; ``results`` the file names written,
    in entry order; ``attempts`` how many times it started (more than one after a crash)."""

    id: str
    seq: int
    state: str
    workflow: str
    priority: int
    request: dict[str, Any]
    created: float
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    results: list[str] = attrs.Factory(list)
    attempts: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL


class JobStore:
    """The jobs of one server in a SQLite file; every method is safe from any thread.

    Args:
        path: The database file (made with its folder when missing); ``":memory:"`` for a store that does not
            outlive the process (tests, benchmarks).

    Raises:
        sqlite3.DatabaseError: the file is not a database of this server (the message names it).
    """

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
        except sqlite3.DatabaseError as error:
            self._db.close()
            msg = f"{self.path} is not a job database this server can use ({error}); move it away or pass another --state folder"
            raise sqlite3.DatabaseError(msg) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def add(self, job_id: str, workflow: str, priority: int, request: dict[str, Any]) -> JobRecord:
        """Record a new queued job, committed before returning; its ``seq`` is its arrival number."""
        created = time.time()
        with self._write() as db:
            (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()
            db.execute(
                "INSERT INTO jobs (id, seq, state, workflow, priority, request, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, last + 1, "queued", workflow, priority, json.dumps(request), created),
            )
        return JobRecord(job_id, last + 1, "queued", workflow, priority, dict(request), created)

    def update(self, job_id: str, **fields: Any) -> None:
        """Set fields of one job (``state``, ``started``, ``finished``, ``error``, ``results``, ``attempts``)."""
        unknown = sorted(set(fields) - {"state", "started", "finished", "error", "results", "attempts"})
        if unknown:
            raise KeyError(f"JobStore.update(): unknown field(s) {unknown}")
        if "state" in fields and fields["state"] not in STATES:
            raise ValueError(f"state must be one of {list(STATES)} (got {fields['state']!r})")
        if "results" in fields:
            fields["results"] = json.dumps(list(fields["results"]))
        names = ", ".join(f"{name} = ?" for name in fields)
        with self._write() as db:
            db.execute(f"UPDATE jobs SET {names} WHERE id = ?", (*fields.values(), job_id))

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _record(row)

    def all(self, states: Sequence[str] | None = None, latest: int | None = None) -> list[JobRecord]:
        """Every job (or those in ``states``; the ``latest`` of them only, when given), in arrival order."""
        query, values = "SELECT * FROM jobs", list[str | int](states or ())
        if states is not None and not values:
            return []
        if states is not None:
            query += f" WHERE state IN ({', '.join('?' * len(values))})"
        query += " ORDER BY seq DESC"
        if latest is not None:
            query += " LIMIT ?"
            values.append(latest)
        with self._lock:
            rows = self._db.execute(query, values).fetchall()
        return [_record(row) for row in reversed(rows)]

    def recover(self) -> list[JobRecord]:
        """After a restart: every job left running goes back to the queue; returns the queued jobs in arrival order."""
        with self._write() as db:
            db.execute("UPDATE jobs SET state = 'queued', started = NULL WHERE state = 'running'")
        return self.all(("queued",))


def _record(row: tuple) -> JobRecord:
    job_id, seq, state, workflow, priority, request, created, started, finished, error, results, attempts = (
        row
    )
    return JobRecord(
        job_id,
        seq,
        state,
        workflow,
        priority,
        json.loads(request),
        created,
        started,
        finished,
        error,
        json.loads(results),
        attempts,
    )


def write_result(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to ``folder/name`` atomically: a temporary file in the folder, flushed and synced, then
    renamed over the name (``os.replace``) and the folder synced, so a reader never sees a partial file under
    it and the name survives a crash once this returns. A write that fails removes its temporary file.

    Raises:
        OSError: the folder cannot be written (the name keeps what it held).
    """
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / name
    write_atomically(final, data, f"{os.getpid()}-{threading.get_ident()}")
    return final


# The temporary file of a ``write_result`` in progress: ``.<name>.<pid>-<thread>.partial``.
_PARTIAL = re.compile(r"^\..+\.(?P<pid>\d+)-\d+\.partial$")


def remove_partials(folder: Path) -> list[Path]:
    """Remove the temporary files that writers killed mid-write left in ``folder`` (their process no longer
    runs); those of live processes, this one included, and every file not named as ``write_result`` names
    them stay. Returns what was removed."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _PARTIAL.match(entry)
        if match is None or not process_is_gone(int(match["pid"])):
            continue
        try:
            (folder / entry).unlink()
        except OSError:  # removed meanwhile
            continue
        removed.append(folder / entry)
    return removed


class StateFolderInUseError(RuntimeError):
    """Another process's server holds the state folder: two servers on one folder would run its jobs twice."""


_HELD: dict[str, tuple[int, int]] = {}  # state folder -> (lock file descriptor, holders in this process)
_HELD_LOCK = threading.Lock()


def hold_state_folder(folder: Path) -> Callable[[], None]:
    """Hold ``folder`` for one server until the returned function is called: an exclusive ``flock`` on
    ``folder/serve.lock``, which the system releases when the process ends, however it ends (a ``kill -9``
    included), so a restart after a crash finds it free. Servers of this process share it (a test's
    second scheduler on a folder); elsewhere than POSIX nothing is held.

    Raises:
        StateFolderInUseError: a server of another process holds it (the message names the folder and its pid).
    """
    try:
        import fcntl
    except ImportError:  # Windows: no flock; one server per folder is up to the user there
        return lambda: None
    key = str(folder.resolve())
    with _HELD_LOCK:
        if key in _HELD:
            descriptor, holders = _HELD[key]
            _HELD[key] = (descriptor, holders + 1)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(folder / "serve.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(descriptor)
                msg = (
                    f"the state folder {key} is in use by another server (pid {holder}); stop it, or pass "
                    "another --state folder"
                )
                raise StateFolderInUseError(msg) from None
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
            _HELD[key] = (descriptor, 1)

    def release() -> None:
        with _HELD_LOCK:
            if key not in _HELD:
                return
            descriptor, holders = _HELD[key]
            if holders > 1:
                _HELD[key] = (descriptor, holders - 1)
                return
            del _HELD[key]
            os.close(descriptor)  # closing the last descriptor of the lock releases it

    return _once(release)


def _once(function: Callable[[], None]) -> Callable[[], None]:
    done = threading.Event()

    def call() -> None:
        if not done.is_set():
            done.set()
            function()

    return call
