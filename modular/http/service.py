"""What the HTTP app asks of the jobs it serves (``JobService``), and ``LocalJobs``: one ``Scheduler`` of this
process seen that way.

The app's routes speak to a ``JobService`` only, in JSON values, so the same routes serve one machine's
scheduler (``modular serve``) and a Ray Serve deployment's replicas (``modular/ray_serve/ingress.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from modular.http.memory import memory_report
from modular.serving.events import EventHub
from modular.serving.requests import Limits
from modular.serving.scheduler import Scheduler
from modular.serving.served import ServedWorkflows

__all__ = ["JobService", "LocalJobs", "component_info", "json_value"]


@runtime_checkable
class JobService(Protocol):
    """The jobs behind the HTTP app. ``served`` names the workflows and describes them (the request
    schema is made from it and ``limits``); input images are stored in ``uploads`` and results read from
    ``results``; ``events`` is the hub the event streams listen to. Every job is described by the keys of
    ``ServedJob.describe``."""

    served: ServedWorkflows
    limits: Limits
    max_queue: int
    uploads: Path
    results: Path
    events: EventHub

    def submit(self, data: Any, uploads: Mapping[str, Path] | None = None) -> dict[str, Any]:
        """Check and queue a request; the job as described (``QueueFullError``, the request errors)."""
        ...

    def describe(self, job_id: str) -> dict[str, Any]:
        """One job (``UnknownJobError``)."""
        ...

    def jobs(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Every job known, in arrival order, of ``states`` only when given."""
        ...

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; the job as described (``UnknownJobError``, ``JobStateError``)."""
        ...

    def queue(self) -> dict[str, Any]:
        """``paused``, ``waiting`` (ids in the order they would run), ``running`` (an id or ``None``), ``max_queue``."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def components(self) -> list[dict[str, Any]]:
        """Every loaded component: ``id`` and the manager's model info, as JSON values."""
        ...

    def manager_text(self) -> str:
        """The manager's table as it prints."""
        ...

    def memory(self) -> dict[str, Any]:
        """``devices`` (each with its offload samples) and ``host`` (``modular/http/memory.py``)."""
        ...


class LocalJobs:
    """A ``Scheduler`` of this process as a ``JobService``."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.served = scheduler.served
        self.limits = scheduler.limits
        self.max_queue = scheduler.max_queue
        self.uploads = scheduler.uploads
        self.results = scheduler.results
        self.events = scheduler.events

    def submit(self, data: Any, uploads: Mapping[str, Path] | None = None) -> dict[str, Any]:
        job = self.scheduler.submit(data, uploads)
        return job.describe(self.scheduler.position(job.id))

    def describe(self, job_id: str) -> dict[str, Any]:
        return self.scheduler.describe(job_id)

    def jobs(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        return self.scheduler.jobs(states)

    def cancel(self, job_id: str) -> dict[str, Any]:
        job = self.scheduler.cancel(job_id)
        return job.describe(self.scheduler.position(job.id))

    def queue(self) -> dict[str, Any]:
        running = self.scheduler.running
        return {
            "paused": self.scheduler.paused,
            "waiting": [job.id for job in self.scheduler.waiting()],
            "running": None if running is None else running.id,
            "max_queue": self.max_queue,
        }

    def pause(self) -> None:
        self.scheduler.pause()

    def resume(self) -> None:
        self.scheduler.resume()

    def components(self) -> list[dict[str, Any]]:
        cm = self.scheduler.manager
        return [component_info(cm, component_id) for component_id in list(cm.components)]

    def manager_text(self) -> str:
        return str(self.scheduler.manager)

    def memory(self) -> dict[str, Any]:
        return memory_report(self.scheduler.manager)


def component_info(cm: Any, component_id: str) -> dict[str, Any]:
    """``id`` and the manager's model info of one component as JSON values (just ``id`` once it is removed)."""
    try:
        info = cm.get_model_info(component_id)
    except KeyError:  # removed meanwhile
        return {"id": component_id}
    return {"id": component_id, **{key: json_value(value) for key, value in info.items()}}


def json_value(value: Any) -> Any:
    """``value`` with every part JSON cannot hold written as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_value(item) for item in value]
    return str(value)
