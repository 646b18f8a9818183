"""One served job as the scheduler holds it, and the errors a client's action on a job can meet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from modular.serving.requests import CheckedRequest, seeds_of
from modular.serving.store import JobRecord
from modular.watch.events import CancelToken

__all__ = ["JobStateError", "QueueFullError", "ServedJob", "UnknownJobError", "describe_record"]


class QueueFullError(RuntimeError):
    """The queue holds ``max_queue`` waiting jobs; ``retry_after`` is a guess, in seconds, of when one frees."""

    def __init__(self, max_queue: int, retry_after: int) -> None:
        self.max_queue = max_queue
        self.retry_after = retry_after
        super().__init__(f"the queue is full ({max_queue} jobs wait); try again in about {retry_after} s")


class UnknownJobError(KeyError):
    """No job has this id."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(job_id)

    def __str__(self) -> str:
        return f"no job has id {self.job_id!r}"


class JobStateError(RuntimeError):
    """An action the job's state does not allow (cancelling a finished job, asking for a result not made)."""


@attrs.define(eq=False)
class ServedJob:
    """A job of the queue. ``arrived`` is the scheduler's clock at acceptance (fairness reads it); ``created``,
    ``started``, ``finished`` are seconds since the epoch; ``results`` the result file names written so far,
    in entry order; ``uploads`` the input images the server stored for it."""

    id: str
    seq: int
    request: CheckedRequest
    arrived: float
    created: float
    uploads: dict[str, Path] = attrs.Factory(dict)
    state: str = "queued"
    bypassed: int = 0
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    results: list[str] = attrs.Factory(list)
    attempts: int = 0
    token: CancelToken = attrs.Factory(CancelToken)
    progress: dict[str, Any] = attrs.Factory(dict)

    @property
    def workflow(self) -> str:
        return self.request.workflow

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def seeds(self) -> list[int]:
        return [entry.seed for entry in self.request.entries]

    def describe(self, position: int | None = None) -> dict[str, Any]:
        """The job as JSON values, as ``GET /v1/jobs/{id}`` answers."""
        return _description(
            self.id,
            self.state,
            self.workflow,
            self.priority,
            dict(self.request.data),
            self.seeds,
            self.created,
            self.started,
            self.finished,
            self.error,
            self.results,
            self.attempts,
            position=position,
            bypassed=self.bypassed,
            progress=dict(self.progress),
        )


def _description(
    job_id: str,
    state: str,
    workflow: str,
    priority: int,
    request: dict[str, Any],
    seeds: list[int],
    created: float,
    started: float | None,
    finished: float | None,
    error: str | None,
    results: list[str],
    attempts: int,
    position: int | None = None,
    bypassed: int | None = None,
    progress: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One job's description, whether this process holds it or only the store does: the same keys either way."""
    return {
        "id": job_id,
        "state": state,
        "workflow": workflow,
        "priority": priority,
        "position": position,
        "request": request,
        "seeds": seeds,
        "images": len(seeds),
        "created": created,
        "started": started,
        "finished": finished,
        "waited": None if started is None else round(started - created, 6),
        "ran": None if started is None or finished is None else round(finished - started, 6),
        "error": error,
        "results": list(results),
        "attempts": attempts,
        "bypassed": bypassed,
        "progress": progress or {},
    }


def describe_record(record: JobRecord) -> dict[str, Any]:
    """A job only the store holds (finished before this process started, or dropped from memory), with the
    keys of ``ServedJob.describe``; how often it was passed over is not stored (``None``)."""
    request = record.request.get("request", {})
    try:
        seeds = seeds_of(request)
    except (KeyError, TypeError):  # a request this version did not write
        seeds = []
    return _description(
        record.id,
        record.state,
        record.workflow,
        record.priority,
        request,
        seeds,
        record.created,
        record.started,
        record.finished,
        record.error,
        record.results,
        record.attempts,
    )
