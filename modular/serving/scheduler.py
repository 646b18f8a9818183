"""The scheduler: one queue of jobs over one ComponentsManager, ordered by what the device holds.

``Scheduler.submit`` checks a request (``modular/serving/requests.py``), commits it to the job store
(``modular/serving/store.py``) and queues it; one worker (``start``, or ``run_next`` called by hand) takes the
next job in the order of ``modular/serving/policy.py`` (fairness, priority, then the fewest bytes to bring to
the device, ``modular/serving/cost.py``) and runs it through its workflow's pipeline, loaded lazily through the
manager. While a job runs, the next job's pipeline (the next when the job's call starts, or when a job is
submitted during it) is loaded to the host and, where the device has free room, its models are placed there
(prefetch; it never evicts). Cancel reaches a waiting job at once and a running one before its next block or
step (``pipe(..., cancel=)``); a timeout is a cancel with a reason. A job that fails (bad input found late,
out of memory, an exception in a block) fails alone. Every change of state is written to the store and
published on the event hub (``modular/serving/events.py``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from modular.batch.jobs import call_job
from modular.batch.store import encode
from modular.errors import CallCancelled, PreviewUnavailableError
from modular.serving.call_events import watch_keywords
from modular.serving.cost import bytes_to_bring
from modular.serving.engine_hints import EngineHints
from modular.serving.events import EventHub
from modular.serving.job_times import JobTimes
from modular.serving.jobs import JobStateError, QueueFullError, ServedJob, UnknownJobError, describe_record
from modular.serving.policy import Fairness, order, passed_over
from modular.serving.requests import CheckedRequest, Limits, check_request, open_images
from modular.serving.residency import ResidencyReport, replica_report
from modular.serving.served import ServedWorkflows
from modular.serving.store import JobRecord, JobStore, hold_state_folder, remove_partials, write_result
from modular.watch.events import CancelToken
from offload.errors import ModelTooLargeError

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)
_STOPPING = "the server is stopping"
EXPECTED_CALLS = 8  # waiting jobs told to the engines as the calls that come next
KEEP_FINISHED = 1000  # finished jobs kept in memory; older ones are read from the store
FINISHED = ("done", "failed", "cancelled")
#: What a workflow that does not fit raises, loading or placing its models: reported unloadable to a router.
NO_ROOM = (MemoryError, torch.OutOfMemoryError, ModelTooLargeError)


def error_text(error: BaseException) -> str:
    """An error as the command line shows it (``modular: error: <type>: <message>`` without the prefix)."""
    return f"{type(error).__name__}: {error}"


class Scheduler:
    """A queue of jobs over ``served``'s manager (see the module docstring).

    Args:
        served: The workflows this queue runs (their pipelines bound on one manager).
        state: The folder of the job database (``jobs.sqlite``), results (``results/``) and uploads
            (``uploads/``); ``None`` keeps jobs in memory and results in a temporary folder.
        fairness: ``max_wait`` and ``max_bypass`` (``modular/serving/policy.py``).
        limits: What one request may ask for.
        max_queue: Waiting jobs at most; one more is refused with ``QueueFullError``.
        clock: Seconds for fairness (``time.monotonic``; tests pass a simulated clock).
        prefetch: Load the next job's pipeline and place its models where the device has room while a job runs.
        preview_every: Publish a preview every this many steps (``None``: none).
        device: Where pipelines go when auto offload is off (``None``: they stay where they load).
        events: The hub events go to (a new one by default).
        affinity: Order by the bytes each job would bring to the device; ``False`` runs in arrival order
            (within fairness and priority): the first-come order of other servers, for comparison.

    Raises:
        sqlite3.DatabaseError: the state folder's database is not this server's.
        StateFolderInUseError: a server of another process holds the state folder (until ``close``).
    """

    def __init__(
        self,
        served: ServedWorkflows,
        state: str | Path | None = None,
        *,
        fairness: Fairness | None = None,
        limits: Limits | None = None,
        max_queue: int = 100,
        clock: Callable[[], float] = time.monotonic,
        prefetch: bool = True,
        preview_every: int | None = 1,
        device: str | torch.device | None = None,
        events: EventHub | None = None,
        affinity: bool = True,
    ) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue must be a whole number of at least 1 (got {max_queue!r})")
        if preview_every is not None and (not isinstance(preview_every, int) or preview_every < 1):
            raise ValueError(
                f"preview_every must be a whole number of at least 1 or None (got {preview_every!r})"
            )
        self.served = served
        self.manager = served.manager
        if state is None:
            import tempfile

            self._temporary = tempfile.TemporaryDirectory(prefix="modular-serve-")
            state = self._temporary.name
            self.store = JobStore(":memory:")
            self._release_state: Callable[[], None] = lambda: None  # a folder of its own
        else:
            self._release_state = hold_state_folder(Path(state))
            try:
                self.store = JobStore(Path(state) / "jobs.sqlite")
            except BaseException:
                self._release_state()
                raise
        self.state = Path(state).resolve()
        self.results = self.state / "results"
        self.uploads = self.state / "uploads"
        self.fairness = fairness or Fairness()
        self.limits = limits or Limits()
        self.max_queue = max_queue
        self.clock = clock
        self.prefetch = prefetch
        self.preview_every = preview_every
        self.device = None if device is None else torch.device(device)
        self.events = events or EventHub()
        self.affinity = affinity
        self._cond = threading.Condition(threading.RLock())
        self._jobs: dict[str, ServedJob] = {}
        self._waiting: list[ServedJob] = []
        self._running: ServedJob | None = None
        self._running_call = False  # the running job's pipeline is loaded: a prefetch may start
        self._paused = False
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._prefetcher: threading.Thread | None = None
        self._durations: list[float] = []
        self.job_times = JobTimes()  # the latest done jobs' seconds and moved bytes, by workflow
        self._positions: dict[str, int] = {}
        self._no_previews: set[str] = set()
        self._hints = EngineHints(served)
        self._unloadable: set[str] = set()
        remove_partials(self.results)  # what a server killed mid-write left
        self._recover()

    # -- accepting ----------------------------------------------------------------------------
    def _recover(self) -> None:
        """Queue again what a previous run of this state folder accepted and did not finish."""
        for record in self.store.recover():
            try:
                uploads = {key: Path(path) for key, path in record.request.get("uploads", {}).items()}
                checked = check_request(
                    record.request["request"], self.served, uploads, self.limits, self.results
                )
            except Exception as error:  # the server was started with other workflows or limits
                self.store.update(record.id, state="failed", finished=time.time(), error=error_text(error))
                continue
            job = self._job(record, checked, uploads)
            self._jobs[job.id] = job
            self._waiting.append(job)

    def _job(self, record: JobRecord, checked: CheckedRequest, uploads: dict[str, Path]) -> ServedJob:
        return ServedJob(
            id=record.id,
            seq=record.seq,
            request=checked,
            arrived=self.clock(),
            created=record.created,
            uploads=uploads,
            results=list(record.results),
            attempts=record.attempts,
        )

    def check(self, data: Any, uploads: Mapping[str, Path] | None = None) -> CheckedRequest:
        """Check a request as ``submit`` does, accepting nothing."""
        return check_request(data, self.served, uploads, self.limits, self.results)

    def submit(self, data: Any, uploads: Mapping[str, Path] | None = None) -> ServedJob:
        """Check a request and queue it; the job is in the store before this returns.

        Args:
            data: The request (``modular/serving/requests.py``).
            uploads: Its input images, stored by the server under names it made, by input name.

        Raises:
            QueueFullError: ``max_queue`` jobs wait already.
            RequestError, MissingInputError, UnknownInputError, InputTypeError: a request that cannot run.
        """
        with self._cond:
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(self.max_queue, self.retry_after())
        uploads = dict(uploads or {})
        checked = self.check(data, uploads)
        stored = {"request": dict(checked.data), "uploads": {key: str(path) for key, path in uploads.items()}}
        with self._cond:
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(self.max_queue, self.retry_after())
            record = self.store.add(uuid.uuid4().hex[:16], checked.workflow, checked.priority, stored)
            job = self._job(record, checked, uploads)
            self._jobs[job.id] = job
            self._waiting.append(job)
            self._cond.notify_all()
        self.events.publish("queued", job.id, workflow=job.workflow, priority=job.priority, seeds=job.seeds)
        self._publish_positions()
        if self._running_call:  # a job that comes while another runs is brought up too (once that one's
            self._start_prefetch()  # pipeline is loaded: its own loading goes first)
        return job

    def retry_after(self) -> int:
        """Seconds until a place in the queue frees, as a guess from recent jobs' durations (at least 1)."""
        recent = self._durations[-20:]
        return max(1, round(sum(recent) / len(recent))) if recent else 1

    # -- looking --------------------------------------------------------------------------------
    def job(self, job_id: str) -> ServedJob | JobRecord:
        """The job of ``job_id``: in memory while this process knows it, else as the store recorded it.

        Raises:
            UnknownJobError: no job has this id.
        """
        with self._cond:
            job = self._jobs.get(job_id)
        if job is not None:
            return job
        record = self.store.get(job_id) if isinstance(job_id, str) else None
        if record is None:
            raise UnknownJobError(job_id)
        return record

    def describe(self, job_id: str) -> dict[str, Any]:
        job = self.job(job_id)
        if isinstance(job, JobRecord):
            return describe_record(job)
        return job.describe(self.position(job_id))

    def jobs(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Every job this process holds and the latest ``KEEP_FINISHED`` finished ones of the store it does not
        (finished before a restart), in arrival order, as ``describe`` gives them."""
        with self._cond:
            jobs = sorted(self._jobs.values(), key=lambda job: job.seq)
            positions = self._positions_now()
        held = {job.id for job in jobs}
        described = [
            (job.seq, job.describe(positions.get(job.id)))
            for job in jobs
            if states is None or job.state in states
        ]
        finished = [state for state in states or FINISHED if state in FINISHED]
        stored = self.store.all(finished, latest=KEEP_FINISHED) if finished else []
        older = [record for record in stored if record.id not in held]
        described += [(record.seq, describe_record(record)) for record in older]
        return [description for _, description in sorted(described, key=lambda pair: pair[0])]

    def _positions_now(self) -> dict[str, int]:
        """Each unfinished job's position (the running one 0), from one ordering of the waiting jobs."""
        positions = {job.id: number for number, job in enumerate(self._order(), 1)}
        if self._running is not None:
            positions[self._running.id] = 0
        return positions

    def waiting(self) -> list[ServedJob]:
        """The waiting jobs in the order they would run now."""
        with self._cond:
            return self._order()

    def position(self, job_id: str) -> int | None:
        """1 for the job that runs next, 2 after it...; 0 for the running job; ``None`` for a finished one."""
        with self._cond:
            if self._running is not None and self._running.id == job_id:
                return 0
            for number, job in enumerate(self._order(), 1):
                if job.id == job_id:
                    return number
        return None

    @property
    def running(self) -> ServedJob | None:
        return self._running

    @property
    def paused(self) -> bool:
        return self._paused

    def _order(self) -> list[ServedJob]:
        costs: dict[str, int] = {}

        def cost(job: ServedJob) -> int:
            if not self.affinity:
                return 0
            if job.workflow not in costs:
                costs[job.workflow] = self.cost(job.workflow)
            return costs[job.workflow]

        return order(self._waiting, self.clock(), cost, self.fairness)

    def residency_report(self) -> ResidencyReport:
        """What this scheduler's manager holds, for a router choosing between replicas
        (``modular/serving/residency.py``): the models of the served workflows and the bytes each would still
        move to the device, the jobs waiting or running here, and the workflows that could not load here."""
        with self._cond:
            queued = len(self._waiting) + (self._running is not None)
        pipes = [self.served.pipeline(name) for name in self.served]
        times = self.job_times
        unloadable = sorted(self._unloadable)
        return replica_report(
            self.manager, pipes, queued, unloadable, times.seconds(), times.seconds_per_byte()
        )

    def preload(self) -> None:
        """Load every served workflow's pipeline now (onto the host under auto offload: nothing moves to the
        device), so that no job pays for reading its files; one that does not fit is reported unloadable."""
        on_cuda = self._on_cuda()
        for name in self.served:
            try:
                self.served.load(name, on_cuda)
            except NO_ROOM:
                self._unloadable.add(name)

    def cost(self, workflow: str) -> int:
        """Bytes ``workflow``'s models would bring to the device if it ran now."""
        return bytes_to_bring(self.manager, self.served.pipeline(workflow))

    def _publish_positions(self) -> None:
        # Published under the lock (a publish never blocks): a position computed before the worker took a
        # job can then never arrive after that job's "started" or final event.
        with self._cond:
            now = {job.id: number for number, job in enumerate(self._order(), 1)}
            changed = {
                job_id: number for job_id, number in now.items() if self._positions.get(job_id) != number
            }
            self._positions = now
            for job_id, number in changed.items():
                self.events.publish("position", job_id, position=number)

    # -- acting -----------------------------------------------------------------------------------
    def cancel(self, job_id: str, reason: str = "cancelled by a client") -> ServedJob:
        """Cancel a waiting job (at once) or the running one (before its next block or step).

        Raises:
            UnknownJobError: no job has this id. JobStateError: it has finished already.
        """
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None:
                self.job(job_id)  # raises UnknownJobError for an id the store does not know either
                raise JobStateError(f"job {job_id!r} has finished; there is nothing to cancel")
            if job.state == "queued":
                self._waiting.remove(job)
                self._finish(job, "cancelled", reason)
            elif job.state == "running":
                self._cancel_running(job, reason)
            else:
                raise JobStateError(f"job {job_id!r} is {job.state}; there is nothing to cancel")
        self._publish_positions()
        return job

    def _cancel_running(self, job: ServedJob, reason: str) -> None:
        """Cancel ``job``'s call unless it is cancelled already: the first cancel says how the job ends (a
        stop or a timeout after a client's cancel would requeue it, or fail it)."""
        with self._cond:
            if not job.token.is_set():
                job.token.cancel(reason)

    def pause(self) -> None:
        """Start no new job until ``resume`` (the running one goes on)."""
        with self._cond:
            self._paused = True
        self.events.publish("paused")

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()
        self.events.publish("resumed")

    # -- running ----------------------------------------------------------------------------------
    def _take(self) -> ServedJob | None:
        with self._cond:
            if self._paused or not self._waiting or self._running is not None:
                return None
            if self._stopping and threading.current_thread() is self._worker:
                return None  # a stop came after the worker looked: the job stays queued for the next start
            ordered = self._order()
            chosen = ordered[0]
            for job in passed_over(self._waiting, chosen):
                job.bypassed += 1
            self._waiting.remove(chosen)
            chosen.started = time.time()
            chosen.attempts += 1
            chosen.state = "running"  # last: a reader (no lock) sees the start time with it
            self._running = chosen
        self.store.update(chosen.id, state="running", started=chosen.started, attempts=chosen.attempts)
        return chosen

    def run_next(self) -> ServedJob | None:
        """Run the next job in this thread; returns it when finished, or ``None`` when none may start now."""
        job = self._take()
        if job is None:
            return None
        self.events.publish("started", job.id, workflow=job.workflow, attempt=job.attempts)
        self._publish_positions()
        try:
            self._run(job)
        finally:
            with self._cond:
                self._running = None
                self._running_call = False
                self._cond.notify_all()
            self._publish_positions()
        return job

    def _run(self, job: ServedJob) -> None:
        timeout = job.request.timeout
        timer = None
        if timeout is not None:
            timer = threading.Timer(
                timeout, self._cancel_running, args=(job, f"timed out after {timeout:g} s")
            )
            timer.daemon = True
            timer.start()
        started, moved_before = time.perf_counter(), self._moved_bytes()
        try:
            on_cuda = self._on_cuda()
            try:
                pipe = self.served.load(job.workflow, on_cuda)
            except NO_ROOM:
                self._unloadable.add(job.workflow)  # reported to a router: not sent here again
                raise
            if self.device is not None and not self.manager.offload_engines:
                pipe.to(self.device)
            self._running_call = True
            with self._cond:
                upcoming = [other.workflow for other in self._order()[:EXPECTED_CALLS]]
            self._hints.expect(job.workflow, len(job.request.entries), upcoming)
            self._start_prefetch()
            images = open_images(job.uploads)
            for entry in job.request.entries[len(job.results) :]:
                array = self._call(pipe, job, entry.job(images, on_cuda), entry.index)
                name = f"{job.id}-{entry.index}.png"
                write_result(self.results, name, encode(array, "png"))
                job.results.append(name)
                self.store.update(job.id, results=job.results)
        except CallCancelled as error:
            if error.reason == _STOPPING:  # not the client's cancel: the next start runs it again
                self._requeue(job)
            elif error.reason is not None and error.reason.startswith("timed out"):
                self._finish(job, "failed", error.reason)
            else:
                self._finish(job, "cancelled", error.reason or str(error))
        except Exception as error:  # the job fails alone; the queue and the manager go on
            if isinstance(error, NO_ROOM):
                self._unloadable.add(job.workflow)  # placing it for the call failed: as a failed load
            log.info("job %s failed: %s", job.id, error_text(error))
            self._finish(job, "failed", error_text(error))
        else:
            self._finish(job, "done", None)
        finally:
            self._hints.clear()
            if timer is not None:
                timer.cancel()
            ran = time.perf_counter() - started
            self._durations.append(ran)
            del self._durations[:-100]
            if job.state == "done":  # a prefetch for the next job during this one counts as this one's
                self.job_times.add(job.workflow, ran, max(0, self._moved_bytes() - moved_before))

    def _moved_bytes(self) -> int:
        """Bytes auto offload has moved to the device so far (0 without it)."""
        log = self.manager.offload_log
        return 0 if log is None else log.total_bytes_to_device

    def _requeue(self, job: ServedJob) -> None:
        """Put a job the stop interrupted back in the queue, in the store and in memory, with a fresh token
        (its old one stays set), so that this scheduler's next ``start`` runs it as a new one's would."""
        with self._cond:
            job.state = "queued"
            job.started = None
            job.progress = {}
            job.token = CancelToken()
            self._waiting.append(job)
        self.store.update(job.id, state="queued", started=None)
        self.events.publish("requeued", job.id, reason=_STOPPING)

    def _call(self, pipe: Any, job: ServedJob, call: Any, index: int) -> Any:
        """One image of ``job``; a workflow whose family makes no previews (no latent-to-RGB map for its
        latents) is called without them, which the call's own check says before anything runs."""
        previews = self.preview_every is not None and job.workflow not in self._no_previews
        try:
            return call_job(
                pipe,
                call,
                cancel=job.token,
                **watch_keywords(self.events, job, index, self.preview_every if previews else None),
            )
        except PreviewUnavailableError as error:
            if not previews:
                raise
            self._no_previews.add(job.workflow)
            log.info("%s makes no previews: %s", job.workflow, error)
            return call_job(pipe, call, cancel=job.token, **watch_keywords(self.events, job, index, None))

    def _finish(self, job: ServedJob, state: str, error: str | None) -> None:
        job.error = error
        job.finished = time.time()
        job.state = state  # last: a reader that sees the final state sees its time and error with it
        self.store.update(job.id, state=state, finished=job.finished, error=error)
        fields: dict[str, Any] = {"results": list(job.results)} if state == "done" else {"error": error}
        self.events.publish(state, job.id, **fields)
        with self._cond:
            finished = [
                other for other in self._jobs.values() if other.state in ("done", "failed", "cancelled")
            ]
            for old in sorted(finished, key=lambda other: other.seq)[:-KEEP_FINISHED]:
                del self._jobs[old.id]

    def _on_cuda(self) -> bool:
        engines = self.manager.offload_engines
        if engines:
            return any(engine.execution_device.type == "cuda" for engine in engines)
        return self.device is not None and self.device.type == "cuda"

    # -- prefetch ---------------------------------------------------------------------------------
    def _start_prefetch(self) -> None:
        if not self.prefetch:
            return
        with self._cond:  # checked and started under the lock: the worker and a submitter may both ask
            upcoming = self._order()
            if not upcoming or (self._prefetcher is not None and self._prefetcher.is_alive()):
                return
            self._prefetcher = threading.Thread(
                target=self._hints.prefetch,
                args=(upcoming[0].workflow, self._on_cuda()),
                name="modular-serve-prefetch",
                daemon=True,
            )
            self._prefetcher.start()

    def wait_prefetch(self, timeout: float | None = None) -> None:
        """Wait for a prefetch in progress (tests and benchmarks, which compare bytes)."""
        prefetcher = self._prefetcher
        if prefetcher is not None:
            prefetcher.join(timeout)

    # -- the worker -------------------------------------------------------------------------------
    def start(self) -> None:
        """Run jobs in a worker thread until ``stop``."""
        with self._cond:
            if self._worker is not None and self._worker.is_alive():
                return
            self._stopping = False
            self._worker = threading.Thread(target=self._work, name="modular-serve-worker", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (self._paused or not self._waiting):
                    self._cond.wait()
                if self._stopping:
                    return
            self.run_next()

    def stop(self, cancel_running: bool = True, timeout: float | None = 30.0) -> None:
        """Stop the worker: the running job is cancelled (or, with ``cancel_running=False``, finishes);
        waiting jobs stay queued in the store for the next start."""
        with self._cond:
            self._stopping = True
            running = self._running
            self._cond.notify_all()
        if cancel_running and running is not None:
            self._cancel_running(running, _STOPPING)
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
        self.wait_prefetch(timeout)

    def close(self) -> None:
        self.stop()
        self.store.close()
        self._release_state()
        temporary = getattr(self, "_temporary", None)
        if temporary is not None:
            temporary.cleanup()

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Wait until no job waits or runs (or ``timeout``); True when idle."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._waiting or self._running is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True
