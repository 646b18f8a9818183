"""The jobs this process follows as streams on each replica: what its routers know better than a report.

A replica's residency report is as old as its stats period: a job sent since, or finished since, is not in
it, and between two reports a router that goes by it sends every job to the same replica. The ingress follows
each of its jobs as a stream (the worker's ``run``), so the routers of its process see each one accepted by
its replica (``RequestRouter.on_request_routed``) and ended (``on_request_completed``), and each one's router
counts it on the replica it chose from the moment it chose (Ray asks the replica before it sends: a job
arriving meanwhile must see it). ``StreamedJobs`` keeps them, by replica, in the order they were sent (one
table per process, ``STREAMED``: every router here is told of the streams it sent, and the reports count this
process's streams as one caller's, ``caller_id``).
``waits`` turns them and the reports into each replica's expected wait for a new job, in job times: this
process's jobs as they are now, other callers' as the latest report counted them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from modular.ray_serve.worker import caller_id
from modular.serving.residency import ResidencyReport

__all__ = [
    "CHOSEN_SECONDS",
    "STREAMED",
    "StreamedJob",
    "StreamedJobs",
    "seconds_per_byte",
    "service_seconds",
    "waits",
]


#: Seconds a job chosen for a replica counts there before its replica has accepted it: Ray asks the replica
#: first, and a job that goes nowhere (its caller gave up) is never told of again.
CHOSEN_SECONDS = 2.0


class StreamedJob(NamedTuple):
    replica: str
    workflow: str
    sent: float  # the clock's time when it was chosen for its replica, or when its replica accepted it
    accepted: bool


class StreamedJobs:
    """The unfinished streamed jobs this process sent, by Ray's request id; each replica's latest end.

    Args:
        clock: Seconds, for the times kept (monotonic; a test passes its own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._jobs: dict[str, StreamedJob] = {}
        self._ended: dict[str, float] = {}  # replica: when its latest streamed job ended
        self._lock = threading.Lock()  # Ray calls the hooks on its router's loop; tests from anywhere

    def chosen(self, request: str, replica: str, workflow: str) -> None:
        """A stream of a job of ``workflow`` about to be sent to ``replica``: it counts there from now, so that
        a job that arrives while Ray asks the replica sees it, for ``CHOSEN_SECONDS`` unless accepted."""
        with self._lock:
            if request not in self._jobs or not self._jobs[request].accepted:
                self._jobs[request] = StreamedJob(replica, workflow, self.clock(), accepted=False)

    def sent(self, request: str, replica: str, workflow: str) -> None:
        """A stream of a job of ``workflow`` that ``replica`` accepted."""
        with self._lock:
            self._jobs[request] = StreamedJob(replica, workflow, self.clock(), accepted=True)

    def ended(self, request: str) -> None:
        """A stream's end (its job finished, failed, or its replica died); an unknown request is ignored."""
        with self._lock:
            job = self._jobs.pop(request, None)
            if job is not None:
                self._ended[job.replica] = self.clock()

    def by_replica(self) -> tuple[dict[str, list[StreamedJob]], dict[str, float]]:
        """The unfinished jobs (and those chosen lately) on each replica, first sent first, and when each
        replica's latest streamed job ended: one look for a whole routing decision."""
        now = self.clock()
        with self._lock:
            self._jobs = {
                key: job
                for key, job in self._jobs.items()
                if job.accepted or now - job.sent <= CHOSEN_SECONDS
            }
            jobs, ended = list(self._jobs.values()), dict(self._ended)
        grouped: dict[str, list[StreamedJob]] = {}
        for job in sorted(jobs, key=lambda job: job.sent):
            grouped.setdefault(job.replica, []).append(job)
        return grouped, ended

    def on(self, replica: str) -> list[StreamedJob]:
        """The unfinished jobs on ``replica`` (and those chosen for it lately), first sent first."""
        return self.by_replica()[0].get(replica, [])

    def forget(self, replica: str) -> None:
        """Drop what is kept of a replica that died (its streams end with an error, and Ray says so first)."""
        with self._lock:
            self._jobs = {key: job for key, job in self._jobs.items() if job.replica != replica}
            self._ended.pop(replica, None)


#: This process's streamed jobs, shared by its routers (the reports count them as one caller's).
STREAMED = StreamedJobs()


def _measured(value: float) -> bool:
    return 0 < value < math.inf  # a figure no job could take (0, negative, inf, nan) says nothing


def service_seconds(reports: Mapping[str, ResidencyReport]) -> dict[str, float]:
    """Each workflow's seconds per job, pooled over the replicas that report it (the replicas share hardware
    in a deployment: one figure per workflow ranks them alike)."""
    pooled: dict[str, list[float]] = {}
    for report in reports.values():
        for workflow, seconds in report.seconds.items():
            if _measured(seconds):
                pooled.setdefault(workflow, []).append(seconds)
    return {workflow: sum(values) / len(values) for workflow, values in pooled.items()}


def seconds_per_byte(reports: Mapping[str, ResidencyReport]) -> float:
    """The seconds a moved byte adds to a job, pooled over the replicas that have measured it (0: none has)."""
    measured = [report.seconds_per_byte for report in reports.values() if _measured(report.seconds_per_byte)]
    return sum(measured) / len(measured) if measured else 0.0


def waits(
    reports: Mapping[str, ResidencyReport],
    workflow: str,
    streamed: StreamedJobs = STREAMED,
    caller: str | None = None,
    needs: Mapping[str, int] | None = None,
) -> dict[str, float]:
    """How long a new job of ``workflow`` would wait on each replica before its compute starts, in its own job
    times.

    A replica's work ahead is this process's streamed jobs on it (each its workflow's seconds, the first one's
    time running so far taken off when it is the replica's only work) and the report's other jobs (each the
    mean of the workflows' seconds). Given the job's ``needs`` (load ID to bytes), the time to move what the
    replica lacks of them is added, at the replicas' measured seconds per byte: a wait and a move compare in
    one unit. Before any job has finished anywhere every job counts one second: the waits are then queue
    lengths.
    """
    caller = caller_id() if caller is None else caller
    seconds = service_seconds(reports)
    per_byte = seconds_per_byte(reports) if needs else 0.0
    mean = sum(seconds.values()) / len(seconds) if seconds else 1.0
    now = streamed.clock()
    jobs, ended = streamed.by_replica()
    result = {}
    for replica, report in reports.items():
        own = jobs.get(replica, [])
        others = max(0, report.queued - report.streamed.get(caller, 0))
        work = others * mean + sum(seconds.get(job.workflow, mean) for job in own)
        if own and not others:  # the first is running since it was sent or the one before it ended
            began = max(own[0].sent, ended.get(replica, own[0].sent))
            work -= min(max(0.0, now - began), seconds.get(own[0].workflow, mean))
        if per_byte:
            work += report.bytes_for(needs or {}) * per_byte
        result[replica] = work / seconds.get(workflow, mean)
    return result
