"""Durability of the job store across crashes: a server process (tests/serving/serve_child.py) is killed with
SIGKILL at chosen moments (after k jobs were accepted, while a job runs, right after a result file was renamed
into place and before the store recorded it, halfway through writing one), then a new Scheduler on the same
state folder recovers. Every job the killed server said it accepted ends done, each index with one result
file equal to the direct call's PNG bytes (seeds from the stored request), no leftover partial file; the job
that was running starts again (``attempts`` 2) and a finished one does not run twice.

Also in one process: a graceful ``stop`` puts the running job back in the queue; a stored request that no
longer checks after a restart (the workflow is no longer served) fails alone with the reason.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components import ComponentsManager
from modular.serving import EventHub, JobStore, Scheduler, StateFolderInUseError

from .durable_helpers import DirectCalls, expected_names, request, result_bytes, run_all, served, tiny_repo

CHILD = Path(__file__).with_name("serve_child.py")
ROOT = Path(__file__).resolve().parents[2]
#: The killed server's requests: the first makes two images, so a crash can fall between them.
REQUESTS = [request("sd", 11, images_per_prompt=2), request("sd", 12), request("sd", 13)]
LINE_TIMEOUT = 90.0  # seconds for the child's next line: its imports on a loaded 2-core machine


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return tiny_repo(tmp_path_factory.getbasetemp() / "repos")


@pytest.fixture(scope="module")
def direct(repo):
    return DirectCalls({"sd": (repo, None)})


class ForkingServers:
    """tests/serving/serve_child.py, warmed once: each ``run`` forks a server process from it, reads that
    server's lines until it holds (then kills it with SIGKILL) or ends."""

    def __init__(self, repo: Path, folder: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.errors = folder / "child.err"
        with open(self.errors, "wb") as errors:
            self.process = subprocess.Popen(
                [sys.executable, str(CHILD), str(repo)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=env,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        assert self._next() == "ready"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _next(self) -> str:
        try:
            line = self.lines.get(timeout=LINE_TIMEOUT)
        except queue.Empty:
            line = None
        if line is None:
            raise AssertionError(f"the child said nothing more: {self.errors.read_text()[-3000:]}")
        return line

    def run(self, config: dict, folder: Path) -> tuple[list[str], str]:
        """One server on ``config``; its lines, and how it ended (``killed``, or ``exit 0``)."""
        path = folder / "child.json"
        path.write_text(json.dumps(config))
        assert self.process.stdin is not None
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()
        first = self._next()
        assert first.startswith("pid "), first
        pid = int(first.split()[1])
        seen: list[str] = []
        while True:
            line = self._next()
            if line.startswith("hold "):
                seen.append(line)
                os.kill(pid, signal.SIGKILL)
                line = self._next()
            if line.startswith("ended "):
                ended = line.split(maxsplit=2)[2]
                assert ended in ("exit 0", f"signal {signal.SIGKILL.value}"), (ended, self.errors.read_text())
                return seen, "killed" if ended.startswith("signal") else ended
            seen.append(line)

    def close(self) -> None:
        """Stop the warmed process (it holds nothing to save: each server was a fork of it, and has ended)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.kill()
        self.process.wait(LINE_TIMEOUT)
        self.reader.join(LINE_TIMEOUT)


@pytest.fixture(scope="module")
def servers(repo, tmp_path_factory):
    if not hasattr(os, "fork"):
        pytest.skip("the killed servers are forked (POSIX)")
    forking = ForkingServers(repo, tmp_path_factory.mktemp("child"))
    yield forking
    forking.close()


def accepted(lines: list[str]) -> list[str]:
    return [line.split()[1] for line in lines if line.startswith("accepted ")]


HOLDS = {
    "after two accepts": {"at": "accepted", "job": 1},
    "while the second job runs": {"at": "step", "job": 1},
    "after a result file, before the store records it": {"at": "written", "job": 0, "image": 0},
    "halfway through writing a result file": {"at": "partial", "job": 0, "image": 1},
}


@pytest.mark.parametrize("hold", list(HOLDS.values()), ids=list(HOLDS))
def test_a_killed_server_loses_no_accepted_job_and_writes_each_result_once(
    repo, direct, servers, tmp_path, hold
):
    state = tmp_path / "state"
    lines, ended = servers.run(
        {"repo": str(repo), "state": str(state), "requests": REQUESTS, "hold": hold}, tmp_path
    )
    assert ended == "killed", lines
    printed = accepted(lines)
    held = hold["job"]

    # What the killed server told its clients is on disk: every accepted id, in order, and nothing more.
    store = JobStore(state / "jobs.sqlite")
    try:
        before = {record.id: record for record in store.all()}
    finally:
        store.close()
    assert list(before) == printed
    assert len(printed) == (held + 1 if hold["at"] == "accepted" else len(REQUESTS))
    finished_before = {job_id: record.finished for job_id, record in before.items() if record.state == "done"}
    if hold["at"] != "accepted":
        assert before[printed[held]].state == "running"
        assert set(finished_before) == set(printed[:held])
    if hold["at"] == "partial":
        assert any(name.endswith(".partial") for name in os.listdir(state / "results"))

    # A new server on the same folder recovers and runs the rest.
    scheduler = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state, prefetch=False)
    try:
        assert (
            not [name for name in os.listdir(state / "results") if name.endswith(".partial")]
            if (state / "results").exists()
            else True
        )
        ran = run_all(scheduler)
        assert set(ran) == set(printed) - set(finished_before)  # a finished job does not run again
        records = {job_id: scheduler.job(job_id) for job_id in printed}
        for job_id, job in records.items():
            assert job.state == "done", (job_id, job.error)
            data = before[job_id].request["request"]
            assert result_bytes(scheduler, job_id) == direct.pngs(data), job_id
            was_running = hold["at"] != "accepted" and job_id == printed[held]
            assert job.attempts == (2 if was_running else 1), (job_id, job.attempts)
            if job_id in finished_before:
                assert job.finished == finished_before[job_id]
        names = sorted(os.listdir(state / "results"))
        assert names == expected_names([(job_id, before[job_id].request["request"]) for job_id in printed])
    finally:
        scheduler.close()


def test_a_server_that_is_not_killed_runs_everything(direct, servers, repo, tmp_path):
    """The child itself, without a hold: every job done, as the direct call (the crash tests' baseline)."""
    state = tmp_path / "state"
    lines, ended = servers.run(
        {"repo": str(repo), "state": str(state), "requests": REQUESTS[1:], "hold": None}, tmp_path
    )
    assert ended == "exit 0" and lines[-1] == "idle", lines
    store = JobStore(state / "jobs.sqlite")
    try:
        records = store.all()
    finally:
        store.close()
    assert [record.id for record in records] == accepted(lines)
    for record in records:
        assert (record.state, record.attempts) == ("done", 1)
        pngs = [(state / "results" / name).read_bytes() for name in record.results]
        assert pngs == direct.pngs(record.request["request"])


class StopAtStep(EventHub):
    """Holds the worker at a job's first step until the scheduler's stop has cancelled it."""

    def __init__(self) -> None:
        super().__init__()
        self.at_step = threading.Event()
        self.scheduler: Scheduler | None = None

    def publish(self, kind, job_id=None, **fields):
        event = super().publish(kind, job_id, **fields)
        if kind == "step" and self.scheduler is not None and not self.at_step.is_set():
            running = self.scheduler.running
            self.at_step.set()
            deadline = time.monotonic() + 30
            while running is not None and not running.token.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
        return event


def stopping_scheduler(repo, state):
    """A scheduler of the SD repo whose hub holds its worker at a job's first step until the test stops it."""
    hub = StopAtStep()
    scheduler = Scheduler(
        served(ComponentsManager(), {"sd": (repo, None)}), state, prefetch=False, events=hub
    )
    hub.scheduler = scheduler
    return scheduler, hub


def test_a_graceful_stop_puts_the_running_job_back_in_the_queue(repo, direct, tmp_path):
    state = tmp_path / "state"
    scheduler, hub = stopping_scheduler(repo, state)
    try:
        first = scheduler.submit(request("sd", 21))
        second = scheduler.submit(request("sd", 22))
        scheduler.start()
        assert hub.at_step.wait(60), "the first job never reached its step"
        scheduler.stop()
        assert (first.state, first.attempts, first.results) == ("queued", 1, [])
        assert scheduler.store.get(first.id).state == "queued"
        assert second.state == "queued"
        assert scheduler.position(first.id) is not None
        assert not (state / "results").exists() or os.listdir(state / "results") == []

        # The same scheduler, started again, runs it (its stop's cancel does not stop it again)...
        scheduler.start()
        assert scheduler.wait_idle(60)
        scheduler.stop()
        assert (first.state, first.attempts) == ("done", 2)
        assert result_bytes(scheduler, first.id) == direct.pngs(first.request.data)
        assert second.state == "done"
    finally:
        scheduler.close()


def test_a_job_a_stop_put_back_can_be_cancelled_while_it_waits(repo, tmp_path):
    scheduler, hub = stopping_scheduler(repo, tmp_path / "state")
    try:
        job = scheduler.submit(request("sd", 24))
        scheduler.start()
        assert hub.at_step.wait(60)
        scheduler.stop()
        assert scheduler.waiting() == [job]
        scheduler.cancel(job.id)
        assert (job.state, scheduler.store.get(job.id).state) == ("cancelled", "cancelled")
        assert scheduler.waiting() == [] and scheduler.wait_idle(5)
    finally:
        scheduler.close()


def test_a_job_stopped_gracefully_runs_on_the_next_server(repo, direct, tmp_path):
    state = tmp_path / "state"
    scheduler, hub = stopping_scheduler(repo, state)
    try:
        job = scheduler.submit(request("sd", 23))
        scheduler.start()
        assert hub.at_step.wait(60)
        scheduler.stop()
        assert scheduler.store.get(job.id).state == "queued"
    finally:
        scheduler.close()
    again = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state, prefetch=False)
    try:
        assert run_all(again) == [job.id]
        record = again.job(job.id)
        assert (record.state, record.attempts) == ("done", 2)
        assert result_bytes(again, job.id) == direct.pngs(job.request.data)
    finally:
        again.close()


def test_a_stored_request_that_no_longer_checks_fails_alone_with_the_reason(repo, direct, tmp_path):
    """Restarted without a workflow it served, the server fails that workflow's queued job (saying why), and
    runs the others."""
    state = tmp_path / "state"
    first = Scheduler(served(ComponentsManager(), {"sd": (repo, None), "old": (repo, None)}), state)
    try:
        kept = first.submit(request("sd", 31))
        dropped = first.submit(request("old", 32))
        also_kept = first.submit(request("sd", 33))
    finally:
        first.close()
    second = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state, prefetch=False)
    try:
        gone = second.describe(dropped.id)
        assert gone["state"] == "failed"
        assert "'workflow' 'old' is not served here" in gone["error"] and "serves sd" in gone["error"]
        assert second.store.get(dropped.id).finished is not None
        assert [job.id for job in second.waiting()] == [kept.id, also_kept.id]
        assert run_all(second) == [kept.id, also_kept.id]
        for job in (kept, also_kept):
            assert result_bytes(second, job.id) == direct.pngs(job.request.data)
        assert sorted(os.listdir(state / "results")) == expected_names(
            [(kept.id, kept.request.data), (also_kept.id, also_kept.request.data)]
        )
    finally:
        second.close()


def test_a_server_starting_removes_partial_files_of_writers_gone_only(repo, tmp_path):
    results = tmp_path / "state" / "results"
    results.mkdir(parents=True)
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(child.stdout)  # a process that has ended
    stale = results / f".abc-0.png.{gone}-7.partial"
    live = results / f".abc-1.png.{os.getpid()}-7.partial"
    for path in (stale, live):
        path.write_bytes(b"half a png")
    scheduler = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), tmp_path / "state")
    try:
        assert sorted(os.listdir(results)) == [live.name]
    finally:
        scheduler.close()


def test_after_a_restart_finished_jobs_are_listed_and_described_as_before(repo, tmp_path):
    state = tmp_path / "state"
    first = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state, prefetch=False)
    try:
        done = first.submit(request("sd", 41, images_per_prompt=2))
        cancelled = first.submit(request("sd", 42))
        first.cancel(cancelled.id)
        run_all(first)
        before = {job_id: first.describe(job_id) for job_id in (done.id, cancelled.id)}
    finally:
        first.close()
    second = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state, prefetch=False)
    try:
        later = second.submit(request("sd", 43))
        after = {job_id: second.describe(job_id) for job_id in (done.id, cancelled.id)}
        for job_id, described in after.items():
            assert described.keys() == before[job_id].keys()
            changed = {key for key in described if described[key] != before[job_id][key]}
            assert changed <= {"bypassed", "progress"}, {
                key: (before[job_id][key], described[key]) for key in changed
            }
        assert after[done.id]["seeds"] == done.seeds == [41, 42]
        assert [job["id"] for job in second.jobs()] == [done.id, cancelled.id, later.id]
        assert [job["id"] for job in second.jobs(("done", "queued"))] == [done.id, later.id]
        assert [job["id"] for job in second.jobs(("queued",))] == [later.id]
        assert second.jobs(("running",)) == []
    finally:
        second.close()


LOCKER = """
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("busy", flush=True)
    raise SystemExit(0)
os.pwrite(descriptor, f"{os.getpid()}\\n".encode(), 0)
print("locked", flush=True)
sys.stdin.read()
"""


def probe(state: Path) -> str:
    """Whether another process can take the state folder's lock now: ``locked`` (it could, and let go) or ``busy``."""
    done = subprocess.run(
        [sys.executable, "-c", LOCKER, str(state / "serve.lock")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the state folder is held with flock (POSIX)")
def test_a_state_folder_serves_one_process_at_a_time(repo, tmp_path):
    """While one process's server holds the folder, another's is refused (naming the folder and the pid);
    a scheduler holds the folder until closed, and a killed holder frees it."""
    state = tmp_path / "state"
    state.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(state / "serve.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            StateFolderInUseError, match=f"in use by another server \\(pid {holder.pid}\\)"
        ) as raised:
            Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state)
        assert str(state) in str(raised.value) and "--state" in str(raised.value)
        assert not (state / "jobs.sqlite").exists()  # refused before anything was opened
    finally:
        holder.kill()  # a kill -9 of the holder: the system frees its lock
        holder.wait(LINE_TIMEOUT)
    scheduler = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state)
    try:
        assert probe(state) == "busy"  # this process's scheduler holds it
        again = Scheduler(served(ComponentsManager(), {"sd": (repo, None)}), state)  # this process: shared
        again.close()
        assert probe(state) == "busy"  # still held by the first
    finally:
        scheduler.close()
    assert probe(state) == "locked"  # closed: free


class TakeWhenTold(Scheduler):
    """A scheduler whose worker, about to take a job, waits to be told (so that a stop lands just before)."""

    def __init__(self, *args, **kwargs) -> None:
        self.about_to_take = threading.Event()
        self.take = threading.Event()
        super().__init__(*args, **kwargs)

    def _take(self):
        if threading.current_thread() is self._worker and not self.take.is_set():
            self.about_to_take.set()
            self.take.wait(30)
        return super()._take()


def test_a_stop_just_before_the_worker_takes_a_job_leaves_it_queued(repo, tmp_path):
    """The worker looked (not stopping), then a stop came before it took the job: the job is not started."""
    scheduler = TakeWhenTold(
        served(ComponentsManager(), {"sd": (repo, None)}), tmp_path / "state", prefetch=False
    )
    try:
        job = scheduler.submit(request("sd", 25))
        scheduler.start()
        assert scheduler.about_to_take.wait(30)
        stopping = threading.Thread(target=scheduler.stop)
        stopping.start()
        deadline = time.monotonic() + 30
        while not scheduler._stopping and time.monotonic() < deadline:
            time.sleep(0.01)
        scheduler.take.set()
        stopping.join(60)
        assert not stopping.is_alive()
        assert (job.state, job.attempts, scheduler.store.get(job.id).state) == ("queued", 0, "queued")
        assert scheduler.run_next() is job and job.state == "done"  # by hand, after the stop: it runs
    finally:
        scheduler.take.set()
        scheduler.close()
