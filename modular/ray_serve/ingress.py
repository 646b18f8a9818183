"""The ingress of a Ray Serve deployment: ``RoutedJobs``, a ``JobService`` over worker replicas, that the
HTTP app of ``modular serve`` serves unchanged (``make_app(RoutedJobs(...))``).

The ingress checks a request as one machine's server does (the same ``check_request``, limits and
messages, so a client cannot tell them apart), keeps each job in its own table and drives it with one
streamed call to a worker (``ReplicaWorker.run``, routed by residency). The replica's events are published
on the ingress's hub under the ingress's job id, with ``replica``; the final ``done`` brings the images,
which the ingress writes to its ``results`` folder. A call that breaks before the final event (the replica
died, or was stopped) is tried again, on whichever replica the router chooses then, up to ``tries`` tries
in all; the failed job then says why. A job that failed to load on one replica (``unloadable``) is tried on
another likewise, since the router sends it there no more. Before a job is sent again, its old replica is
asked to cancel it, and the ingress takes images from the current try only: a job never ends with two
results.

Pause holds new jobs at the ingress and pauses every replica the router sees, so no job starts anywhere
until ``resume``. ``Workers`` is what the ingress needs of the replicas; ``modular/ray_serve/app.py`` gives it
over a Ray Serve handle, ``modular/ray_serve/local_workers.py`` over replicas of this process.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from modular.http.memory import rss_bytes
from modular.serving.events import FINAL_KINDS, EventHub
from modular.serving.jobs import JobStateError, QueueFullError, ServedJob, UnknownJobError
from modular.serving.requests import Limits, check_request
from modular.serving.served import ServedWorkflows
from modular.serving.store import write_result

__all__ = ["RoutedJob", "RoutedJobs", "Workers"]

log = logging.getLogger(__name__)
CALL_TIMEOUT = 30.0  # seconds a call addressed to one replica (cancel, pause, the manager) may take
RETRY_PAUSE = 0.5  # seconds before a job is sent again after its replica was lost or full
KEEP_FINISHED = 1000  # finished jobs the ingress keeps; older ones are forgotten
# The replica's own events that the ingress does not pass on: it says them itself.
_NOT_PASSED = frozenset({"assigned", "queued"})


class Workers(Protocol):
    """The worker replicas, as the ingress reaches them."""

    def run(self, data: Mapping[str, Any], images: Mapping[str, tuple[str, bytes]]) -> AsyncIterator[dict]:
        """Stream ``ReplicaWorker.run`` on the replica the router chooses."""
        ...

    async def call(self, replica: str, method: str, *args: Any) -> Any:
        """``method(*args)`` on one replica (a job method takes the replica's job id as its first argument;
        a replica method is sent ``replica`` itself)."""
        ...

    def replicas(self) -> list[str]:
        """The replicas' ids now."""
        ...


@attrs.define(eq=False)
class RoutedJob(ServedJob):
    """A job of the ingress: a ``ServedJob`` with the replica running it (``replica``, and ``replica_job``,
    its id there), the position the replica last gave it, and the client's cancel once asked."""

    images: dict[str, tuple[str, Path]] = attrs.Factory(dict)
    replica: str | None = None
    replica_job: str | None = None
    position: int | None = None
    cancel_reason: str | None = None
    tried_on: list[str] = attrs.Factory(list)

    def describe(self, position: int | None = None) -> dict[str, Any]:
        return {**super().describe(self.position if position is None else position), "replica": self.replica}


class RoutedJobs:
    """Jobs routed to worker replicas, as a ``JobService`` (see the module docstring).

    Args:
        served: The workflows the workers serve, bound here only to check requests (nothing loads).
        workers: The replicas.
        limits: What one request may ask for (the workers' own should be the same).
        max_queue: Unfinished jobs the ingress holds before it refuses more (429).
        tries: Tries of one job before it fails (a lost replica, a workflow a replica cannot load).
        events: The hub the event streams listen to.

    Raises:
        ValueError: ``max_queue`` or ``tries`` is not a whole number of at least 1.
    """

    def __init__(
        self,
        served: ServedWorkflows,
        workers: Workers,
        *,
        limits: Limits | None = None,
        max_queue: int = 100,
        tries: int = 3,
        events: EventHub | None = None,
    ) -> None:
        for name, value in (("max_queue", max_queue), ("tries", tries)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1 (got {value!r})")
        self.served = served
        self.workers = workers
        self.limits = limits or Limits()
        self.max_queue = max_queue
        self.tries = tries
        self.events = events or EventHub()
        self._folder = tempfile.TemporaryDirectory(prefix="modular-ingress-")
        self.uploads = Path(self._folder.name) / "uploads"
        self.results = Path(self._folder.name) / "results"
        self._lock = threading.RLock()
        self._jobs: dict[str, RoutedJob] = {}
        self._held: list[RoutedJob] = []  # taken while paused: sent on resume
        self._seq = 0
        self._paused = False
        self._closed = False
        self._durations: list[float] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="modular-ingress", daemon=True)
        self._thread.start()

    # -- the JobService -------------------------------------------------------------------------
    def submit(self, data: Any, uploads: Mapping[str, Path] | None = None) -> dict[str, Any]:
        """Check a request as one machine's server does and send it to a replica; the job as it was queued.

        Raises:
            QueueFullError: ``max_queue`` jobs are unfinished.
            RequestError, MissingInputError, UnknownInputError, InputTypeError: a request that cannot run.
        """
        self._check_open()
        self._check_room()
        uploads = dict(uploads or {})
        checked = check_request(data, self.served, uploads, self.limits, self.results)
        with self._lock:
            self._check_room()
            self._seq += 1
            job = RoutedJob(
                uuid.uuid4().hex[:16],
                self._seq,
                checked,
                time.monotonic(),
                time.time(),
                uploads=uploads,
                images={name: (path.name, path) for name, path in uploads.items()},
            )
            self._jobs[job.id] = job
            held = self._paused
            if held:
                self._held.append(job)
        self.events.publish("queued", job.id, workflow=job.workflow, priority=job.priority, seeds=job.seeds)
        # Described before it is sent: a replica may take it (and the description change) before _send returns.
        queued = job.describe()
        if not held:
            self._send(job)
        return queued

    def describe(self, job_id: str) -> dict[str, Any]:
        return self._job(job_id).describe()

    def jobs(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            jobs = sorted(self._jobs.values(), key=lambda job: job.seq)
        return [job.describe() for job in jobs if states is None or job.state in states]

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job: one held here at once, one on a replica through that replica (its stream then
        ends ``cancelled``).

        Raises:
            UnknownJobError: no job has this id. JobStateError: it has finished already.
        """
        reason = "cancelled by a client"
        job = self._job(job_id)
        with self._lock:
            if job.state in FINAL_KINDS:
                raise JobStateError(f"job {job_id!r} is {job.state}; there is nothing to cancel")
            job.cancel_reason = reason
            held = job in self._held
            if held:
                self._held.remove(job)
            replica_job, replica = job.replica_job, job.replica
        if held:
            self._finish(job, "cancelled", reason)
        elif replica_job is not None and replica is not None:
            self._cancel_on(replica, replica_job)
        return job.describe()

    def queue(self) -> dict[str, Any]:
        with self._lock:
            jobs = sorted(self._jobs.values(), key=lambda job: job.seq)
            paused = self._paused
        running = [job.id for job in jobs if job.state == "running"]
        return {
            "paused": paused,
            "waiting": [job.id for job in jobs if job.state == "queued"],
            "running": running[0] if running else None,
            "running_all": running,
            "max_queue": self.max_queue,
            "replicas": {
                replica: [job.id for job in jobs if job.replica == replica and job.state not in FINAL_KINDS]
                for replica in self._replicas()
            },
        }

    def pause(self) -> None:
        """Start no new job on any replica until ``resume`` (running ones go on)."""
        with self._lock:
            self._paused = True
        self._each_replica("pause")
        self.events.publish("paused")

    def resume(self) -> None:
        with self._lock:
            self._paused = False
            held, self._held = self._held, []
        self._each_replica("resume")
        self.events.publish("resumed")
        for job in held:
            self._send(job)

    def components(self) -> list[dict[str, Any]]:
        """Every replica's components, each with ``replica``."""
        return [
            {**component, "replica": replica}
            for replica, components in self._each_replica("components").items()
            for component in components
        ]

    def manager_text(self) -> str:
        """Each replica's manager table under its id."""
        tables = self._each_replica("manager_text")
        return "\n\n".join(f"replica {replica}\n{table}" for replica, table in tables.items())

    def memory(self) -> dict[str, Any]:
        """Every replica's devices (named ``REPLICA/DEVICE``), the ingress's host bytes and each replica's."""
        devices, hosts = [], {}
        for replica, report in self._each_replica("memory").items():
            devices += [{**device, "device": f"{replica}/{device['device']}"} for device in report["devices"]]
            hosts[replica] = report["host"]
        return {"devices": devices, "host": {"rss": rss_bytes(), "host_copies": 0}, "replicas": hosts}

    def close(self, timeout: float = 10.0) -> None:
        """Stop driving jobs (their streams close, so their replicas cancel them), end each unfinished one
        ``cancelled``, and end the loop; again: nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True

        async def cancel_all() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(timeout)
        except Exception:  # a stream that does not end in time: the loop stops all the same
            log.warning("the ingress's jobs did not stop within %s s", timeout)
        with self._lock:  # no one drives them now: they end here, so no listener waits for them
            unfinished = [job for job in self._jobs.values() if job.state not in FINAL_KINDS]
            self._held = []
        for job in unfinished:
            self._finish(job, "cancelled", "the ingress closed before the job ended")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._folder.cleanup()

    # -- helpers --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ingress is closed")

    def _check_room(self) -> None:
        with self._lock:
            unfinished = sum(job.state not in FINAL_KINDS for job in self._jobs.values())
        if unfinished >= self.max_queue:
            recent = self._durations[-20:]
            retry = max(1, round(sum(recent) / len(recent))) if recent else 1
            raise QueueFullError(self.max_queue, retry)

    def _job(self, job_id: str) -> RoutedJob:
        with self._lock:
            job = self._jobs.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            raise UnknownJobError(job_id)
        return job

    def _replicas(self) -> list[str]:
        try:
            return list(self.workers.replicas())
        except Exception:  # the cluster is going away: no replica to list
            log.warning("could not list the replicas", exc_info=True)
            return []

    def _on_loop(self, coroutine: Any, timeout: float = CALL_TIMEOUT) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _each_replica(self, method: str) -> dict[str, Any]:
        """``method`` on every replica, by replica id; a replica that cannot answer (it just stopped) is
        left out and logged."""

        async def ask_all() -> list[Any]:
            calls = [self.workers.call(replica, method, replica) for replica in replicas]
            return await asyncio.gather(*calls, return_exceptions=True)

        replicas = self._replicas()
        answers = self._on_loop(ask_all()) if replicas else []
        found = {}
        for replica, answer in zip(replicas, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("replica %s did not answer %s: %s", replica, method, answer)
            else:
                found[replica] = answer
        return found

    def _cancel_on(self, replica: str, replica_job: str) -> None:
        async def cancel() -> None:
            try:
                await self.workers.call(replica, "cancel", replica_job)
            except (UnknownJobError, JobStateError):
                pass  # finished meanwhile, or its replica is gone: its stream says how it ended
            except Exception as error:
                log.info("replica %s could not cancel %s: %s", replica, replica_job, error)

        asyncio.run_coroutine_threadsafe(cancel(), self._loop)

    def _send(self, job: RoutedJob) -> None:
        asyncio.run_coroutine_threadsafe(self._drive(job), self._loop)

    # -- driving one job ------------------------------------------------------------------------
    async def _drive(self, job: RoutedJob) -> None:
        """Send ``job`` until it ends: on a lost replica or one that cannot load it, again (``tries``)."""
        last = "no replica took it"
        while job.state not in FINAL_KINDS:
            if job.cancel_reason is not None:
                self._finish(job, "cancelled", job.cancel_reason)
                return
            if job.attempts >= self.tries:
                tried = ", ".join(job.tried_on) or "none"
                self._finish(job, "failed", f"{last} (tried {job.attempts} times, on replicas {tried})")
                return
            job.attempts += 1
            try:
                last = await self._try(job)
            except QueueFullError:
                job.attempts -= 1  # a full replica is not a failed try: wait for room
                await asyncio.sleep(RETRY_PAUSE)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the request itself was refused there: trying again cannot help
                if _lost(error):
                    lost = "no replica took it" if job.replica is None else f"replica {job.replica} was lost"
                    last = f"{lost}: {type(error).__name__}: {error}"
                else:
                    self._finish(job, "failed", f"{type(error).__name__}: {error}")
                    return
            if job.state in FINAL_KINDS:
                return
            old_replica, old_job = job.replica, job.replica_job
            if old_replica is not None and old_job is not None:
                self._cancel_on(old_replica, old_job)  # if it lives on: it must not make a second result
            if job.attempts >= self.tries or job.cancel_reason is not None:
                continue  # no try left (or cancelled): ends above, on the replica it was last on
            with self._lock:
                job.replica = job.replica_job = job.position = None
                job.state, job.started, job.progress = "queued", None, {}
            self.events.publish("retrying", job.id, reason=last, attempt=job.attempts, replica=old_replica)
            await asyncio.sleep(RETRY_PAUSE)

    async def _try(self, job: RoutedJob) -> str:
        """One try of ``job`` on one replica; returns why it did not end there (else it has ended)."""
        images = {name: (stored, path.read_bytes()) for name, (stored, path) in job.images.items()}
        async for event in self.workers.run(dict(job.request.data), images):
            kind = event.get("kind")
            if kind == "assigned":
                with self._lock:
                    job.replica, job.replica_job = event["replica"], event["replica_job"]
                    job.tried_on.append(event["replica"])
                    cancel = job.cancel_reason
                self.events.publish("assigned", job.id, replica=job.replica)
                if cancel is not None:
                    self._cancel_on(job.replica, job.replica_job)
                continue
            if kind in _NOT_PASSED:
                continue
            if kind == "failed" and event.get("unloadable"):
                return f"replica {job.replica} could not load {job.workflow}: {event.get('error')}"
            self._on_event(job, event)
            if kind in FINAL_KINDS:
                return ""
        return f"the stream of replica {job.replica} ended before the job did"

    def _on_event(self, job: RoutedJob, event: dict[str, Any]) -> None:
        kind = event["kind"]
        fields = {key: value for key, value in event.items() if key not in ("kind", "job", "time", "seq")}
        if kind == "position":
            job.position = fields.get("position")
        elif kind == "started":
            job.state, job.started, job.position = "running", time.time(), 0
            # the ingress's try, not the replica's (each try is a new job there: its first)
            fields["attempt"] = job.attempts
        elif kind == "step":
            job.progress = {key: fields.get(key) for key in ("image", "step", "total", "stage")}
        elif kind == "requeued":
            job.state, job.started = "queued", None
        if kind == "done":
            names = []
            for index, data in enumerate(fields.pop("images", [])):
                name = f"{job.id}-{index}.png"
                write_result(self.results, name, data)
                names.append(name)
            job.results = names
            self._finish(job, "done", None)
            return
        if kind in FINAL_KINDS:
            self._finish(job, kind, fields.get("error"))
            return
        self.events.publish(kind, job.id, **fields)

    def _finish(self, job: RoutedJob, state: str, error: str | None) -> None:
        with self._lock:
            if job.state in FINAL_KINDS:
                return
            job.error, job.finished, job.position = error, time.time(), None
            job.state = state
            if job.started is not None:
                self._durations = [*self._durations[-99:], job.finished - job.started]
            finished = [other for other in self._jobs.values() if other.state in FINAL_KINDS]
            for old in sorted(finished, key=lambda other: other.seq)[:-KEEP_FINISHED]:
                del self._jobs[old.id]
        fields: dict[str, Any] = {"results": list(job.results)} if state == "done" else {"error": error}
        self.events.publish(state, job.id, replica=job.replica, **fields)


def _lost(error: BaseException) -> bool:
    """Whether ``error`` says the replica (or the way to it) is gone, rather than that it refused the job."""
    from modular.errors import InputTypeError, MissingInputError, UnknownInputError
    from modular.serving.requests import RequestError

    refused = (RequestError, MissingInputError, UnknownInputError, InputTypeError, ValueError, TypeError)
    return not isinstance(error, refused)
