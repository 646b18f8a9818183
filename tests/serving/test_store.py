"""The job store (modular/serving/store.py): one SQLite file, each job committed before ``add`` returns, refused
updates that change nothing, a damaged file named in the error, and result files written atomically."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading

import pytest

from modular.serving.store import STATES, JobStore, remove_partials, write_result


@pytest.fixture
def store(tmp_path):
    opened = JobStore(tmp_path / "state" / "jobs.sqlite")
    yield opened
    opened.close()


def request(seed: int) -> dict:
    return {"request": {"workflow": "sd", "prompt": "a fox", "seed": seed}, "uploads": {}}


def test_add_get_all_and_update(store):
    first = store.add("job-a", "sd", 0, request(1))
    second = store.add("job-b", "flux", 5, request(2))
    assert (first.seq, second.seq) == (1, 2)
    assert (first.state, first.attempts, first.results) == ("queued", 0, [])
    assert store.get("job-b") == second
    assert store.get("nope") is None
    assert [record.id for record in store.all()] == ["job-a", "job-b"]

    store.update("job-a", state="running", started=10.0, attempts=1)
    store.update("job-a", results=["job-a-0.png"])
    store.update("job-a", state="done", finished=12.5)
    store.update("job-b", state="failed", error="ValueError: no")
    done = store.get("job-a")
    assert (done.state, done.started, done.finished, done.attempts) == ("done", 10.0, 12.5, 1)
    assert done.results == ["job-a-0.png"] and done.final
    assert done.request == request(1)
    assert [record.id for record in store.all(("failed",))] == ["job-b"]
    assert store.get("job-b").error == "ValueError: no"


def test_a_job_is_committed_before_add_returns(store):
    """Another connection (another process after a crash) sees the job as soon as ``add`` returned."""
    store.add("job-a", "sd", 3, request(7))
    other = sqlite3.connect(store.path)
    try:
        rows = other.execute("SELECT id, state, workflow, priority, request FROM jobs").fetchall()
    finally:
        other.close()
    assert rows == [("job-a", "queued", "sd", 3, json.dumps(request(7)))]
    synchronous = store._db.execute("PRAGMA synchronous").fetchone()[0]
    journal = store._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert (synchronous, journal) == (2, "wal")  # FULL: the commit is on disk, not only in the OS's cache


def test_a_second_store_on_the_file_reads_what_the_first_wrote(tmp_path):
    path = tmp_path / "jobs.sqlite"
    first = JobStore(path)
    first.add("job-a", "sd", 0, request(1))
    first.update("job-a", state="running", started=1.0, attempts=1, results=["job-a-0.png"])
    second = JobStore(path)  # the first is not closed: as after a kill -9
    try:
        assert second.get("job-a").results == ["job-a-0.png"]
        assert second.add("job-b", "sd", 0, request(2)).seq == 2
    finally:
        first.close()
        second.close()


def test_recover_queues_again_the_jobs_left_running(store):
    for name in ("queued", "running", "done", "failed", "cancelled"):
        store.add(name, "sd", 0, request(1))
        store.update(name, state=name, started=1.0 if name != "queued" else None, attempts=1)
    store.update("running", results=["running-0.png"])
    queued = store.recover()
    assert [record.id for record in queued] == ["queued", "running"]
    running = store.get("running")
    assert (running.state, running.started, running.results, running.attempts) == (
        "queued",
        None,
        ["running-0.png"],  # what it wrote is kept: it runs the rest only
        1,
    )
    assert [store.get(name).state for name in ("done", "failed", "cancelled")] == [
        "done",
        "failed",
        "cancelled",
    ]


def test_update_refuses_unknown_fields_and_states_and_changes_nothing(store):
    store.add("job-a", "sd", 0, request(1))
    before = store.get("job-a")
    with pytest.raises(KeyError, match=r"unknown field\(s\) \['priority'\]"):
        store.update("job-a", priority=9, error="changed")
    with pytest.raises(ValueError, match=r"state must be one of .*'queued'.*\(got 'paused'\)"):
        store.update("job-a", state="paused", error="changed")
    assert store.get("job-a") == before
    assert set(STATES) == {"queued", "running", "done", "failed", "cancelled"}


def test_a_damaged_database_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "jobs.sqlite"
    path.write_bytes(random.Random(0).randbytes(8192))
    with pytest.raises(sqlite3.DatabaseError, match="not a job database") as raised:
        JobStore(path)
    assert str(path) in str(raised.value)
    assert "--state" in str(raised.value)  # the fix: another folder, or move the file away
    assert path.read_bytes() == random.Random(0).randbytes(8192)  # left as it was


def test_concurrent_adds_from_threads_get_unique_seqs(store):
    barrier = threading.Barrier(8)
    seqs: list[int] = []
    errors: list[BaseException] = []

    def add_some(thread: int) -> None:
        try:
            barrier.wait(timeout=10)
            for number in range(10):
                seqs.append(store.add(f"job-{thread}-{number}", "sd", 0, request(number)).seq)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=add_some, args=(thread,)) for thread in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert sorted(seqs) == list(range(1, 81))
    assert [record.seq for record in store.all()] == list(range(1, 81))


def test_write_result_replaces_the_name_in_one_step(tmp_path, monkeypatch):
    """While the new bytes are written and synced, the name still holds the old file whole; then the new."""
    folder = tmp_path / "results"
    write_result(folder, "job-0.png", b"old bytes")
    seen = []
    real_fsync = os.fsync

    def fsync(fd):
        seen.append((folder / "job-0.png").read_bytes())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = write_result(folder, "job-0.png", b"new bytes, longer")
    assert path == folder / "job-0.png"
    assert path.read_bytes() == b"new bytes, longer"
    assert seen[0] == b"old bytes"  # the file's sync; then the folder's, after the rename
    assert os.listdir(folder) == ["job-0.png"]


def test_write_result_that_fails_leaves_no_partial_file(tmp_path, monkeypatch):
    folder = tmp_path / "results"
    write_result(folder, "job-0.png", b"old bytes")

    def fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="No space left"):
        write_result(folder, "job-0.png", b"new bytes")
    assert os.listdir(folder) == ["job-0.png"]
    assert (folder / "job-0.png").read_bytes() == b"old bytes"


def test_remove_partials_removes_those_of_processes_gone_only(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    gone = _pid_gone()
    stale = folder / f".job-0.png.{gone}-1.partial"
    mine = folder / f".job-1.png.{os.getpid()}-1.partial"
    other = folder / "notes.partial"  # not named as write_result names its files
    for path in (stale, mine, other):
        path.write_bytes(b"half")
    (folder / "job-2.png").write_bytes(b"whole")
    assert remove_partials(folder) == [stale]
    assert sorted(os.listdir(folder)) == sorted([mine.name, other.name, "job-2.png"])
    assert remove_partials(tmp_path / "missing") == []


def _pid_gone() -> int:
    """A process id no process has now."""
    for pid in range(4_000_000, 3_000_000, -7):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            continue
    raise AssertionError("every probed pid is taken")


def test_all_gives_the_latest_of_some_states_in_arrival_order(store):
    for number in range(6):
        store.add(f"job-{number}", "sd", 0, request(number))
        store.update(f"job-{number}", state="done" if number % 2 else "cancelled")
    assert [record.id for record in store.all(("done",), latest=2)] == ["job-3", "job-5"]
    assert [record.id for record in store.all(latest=3)] == ["job-3", "job-4", "job-5"]
    assert [record.id for record in store.all(("done", "cancelled"))] == [f"job-{n}" for n in range(6)]
    assert store.all(()) == [] and store.all(("queued",)) == []
