"""One replica of a Ray Serve deployment: a manager, the served workflows and a started scheduler.

``ReplicaWorker`` is a plain class: Ray Serve wraps it (``serve.deployment(ReplicaWorker)``, see
``modular/ray_serve/app.py``) and calls its methods in the replica's process; tests and programs without
Ray call them directly. Job ids it gives out name the replica (``REPLICA:JOB``) so that a router can send
``describe``, ``cancel`` and ``result`` of a job to the replica that holds it (``job_replica``), and the
methods whose first argument is a replica id (``REPLICA_METHODS``: the queue, pause, the manager, memory) to
that replica. ``run`` is the ingress's call: it queues a job and streams its events, the final one with the
images (``modular/ray_serve/ingress.py``). This module imports no Ray: the replica's id comes from Ray's
replica context when there is one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from components import ComponentsManager
from modular.batch.runner import enable_offload
from modular.http.service import LocalJobs
from modular.serving.events import FINAL_KINDS
from modular.serving.jobs import JobStateError, UnknownJobError
from modular.serving.residency import workflow_needs
from modular.serving.scheduler import Scheduler
from modular.serving.served import ServedWorkflow, ServedWorkflows, parse_served
from modular.serving.store import write_result

__all__ = [
    "REPLICA_METHODS",
    "ReplicaClosedError",
    "SEPARATOR",
    "ReplicaWorker",
    "UnknownReplicaError",
    "caller_id",
    "job_replica",
    "needs_table",
    "request_workflow",
    "served_workflows",
]

SEPARATOR = ":"  # between the replica's id and the scheduler's job id in the ids a replica gives out
#: The worker's methods whose first argument is the id of the replica that must answer.
REPLICA_METHODS = frozenset({"queue", "pause", "resume", "components", "manager_text", "memory"})
POLL = 0.02  # seconds between looks at a streamed job's listener (no thread held per stream)
_UPLOAD_NAME = re.compile(r"^[0-9a-f]{64}\.(png|jpg|webp)$")


class ReplicaClosedError(RuntimeError):
    """The replica closed while a streamed job was unfinished (its scheduler requeued the job here)."""


class UnknownReplicaError(LookupError):
    """A call addressed to a replica that is not this one (the router found no replica of that id)."""

    def __init__(self, replica: object, answered: str) -> None:
        self.replica = replica
        super().__init__(f"no replica has id {replica!r} (replica {answered} answered)")


def caller_id() -> str:
    """This process's id as a caller of ``ReplicaWorker.run`` (host and process id): a replica's report counts
    each caller's streamed jobs apart, and the routers of that process know their own."""
    return f"{socket.gethostname()}:{os.getpid()}"


def job_replica(job_id: Any) -> str | None:
    """The replica a job id of ``ReplicaWorker`` names, or ``None`` for anything else."""
    if not isinstance(job_id, str) or SEPARATOR not in job_id:
        return None
    replica, _, job = job_id.rpartition(SEPARATOR)
    return replica or None if job else None


def request_workflow(args: Any, kwargs: Any, workflows: Mapping[str, Any]) -> str | None:
    """The workflow a ``submit(data)`` request names (the only one served when it names none), or ``None``."""
    data = args[0] if args else (kwargs or {}).get("data")
    if not isinstance(data, Mapping):
        return None
    name = data.get("workflow")
    if name is None and len(workflows) == 1:
        return next(iter(workflows))
    return name if isinstance(name, str) and name in workflows else None


def served_workflows(workflows: Sequence[ServedWorkflow | str]) -> list[ServedWorkflow]:
    """``workflows`` as ``ServedWorkflow`` (a text is read as the command line reads it, ``parse_served``)."""
    return [parse_served(item) if isinstance(item, str) else item for item in workflows]


def needs_table(served: ServedWorkflows) -> dict[str, dict[str, int]]:
    """For each served workflow, its models by load ID with their sizes (``workflow_needs``): the table a
    ``ResidencyRouter`` is started with. Built from the bound pipelines (index and weight files) when nothing
    is loaded; components of no bytes (a tokenizer, a scheduler: no weight files) are left out, as a
    replica's report leaves them out (they move nothing)."""
    table = {}
    for name in served:
        needs = workflow_needs(served.manager, served.pipeline(name))
        table[name] = {load_id: size for load_id, size in needs.items() if size}
    return table


def _ray_replica_id() -> str | None:
    """This replica's id when Ray Serve runs it (the id its router sees), else ``None``."""
    try:
        from ray import serve  # only present (and only asked) inside a Ray Serve replica

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # no Ray, or not inside a replica
        return None


class ReplicaWorker:
    """One replica: a ``ComponentsManager`` (auto offload as below), ``ServedWorkflows`` and a started
    ``Scheduler``; the methods are what Ray Serve's handle calls.

    Args:
        workflows: What to serve (``ServedWorkflow``, or ``REPO``, ``REPO:WORKFLOW``, ``NAME=REPO[:WORKFLOW]``).
        budget: Device bytes: auto offload onto a ``SimulatedDevice(budget)``. ``None``: auto offload onto the
            replica's CUDA device when it has one (Ray gives it with ``num_gpus=1``), else models stay on the CPU.
        bandwidth: With ``budget``: the simulated device's host-to-device bytes per second (or ``"100MB/s"``),
            its moves taking that time on the wall clock (``benchmarks/serving.py --ray``); ``None``: moves
            take no time.
        preload: Load every workflow's pipeline before the replica takes jobs (``Scheduler.preload``), so
            its first jobs do not read their files; else each loads with its first job.
        base: The folder relative repos are read from.
        replica_id: This replica's id (default: Ray's, or a new one outside Ray).
        state: The scheduler's state folder (``None``: in memory; one per replica).
        scheduler_options: Passed to ``Scheduler`` (``limits``, ``fairness``, ``preview_every``, ...).

    Raises:
        ValueError: no workflow, two with one name, a bad budget or bandwidth, a bandwidth without a budget.
        FileNotFoundError, JobFileError: a repo that cannot be read.
    """

    def __init__(
        self,
        workflows: Sequence[ServedWorkflow | str],
        budget: int | None = None,
        *,
        bandwidth: int | str | None = None,
        preload: bool = False,
        base: str | Path = ".",
        replica_id: str | None = None,
        state: str | Path | None = None,
        **scheduler_options: Any,
    ) -> None:
        if bandwidth is not None and budget is None:
            raise ValueError(f"bandwidth {bandwidth!r} is a simulated device's: give a budget too")
        self.replica_id = replica_id or _ray_replica_id() or uuid.uuid4().hex[:8]
        if SEPARATOR in self.replica_id:
            raise ValueError(f"a replica id may not hold {SEPARATOR!r} (got {self.replica_id!r})")
        self.manager = ComponentsManager()
        cuda = torch.cuda.is_available()
        device = torch.device("cuda") if cuda else torch.device("cpu")
        offload = "sim" if budget is not None else ("auto" if cuda else "none")
        self.where = enable_offload(self.manager, offload, device, budget, bandwidth=bandwidth)
        self.served = ServedWorkflows(served_workflows(workflows), self.manager, base)
        self.scheduler = Scheduler(self.served, state, **scheduler_options)
        if preload:
            try:
                self.scheduler.preload()
            except BaseException:
                self.scheduler.close()
                raise
        self._closed = False
        self._streamed: Counter[str] = Counter()  # unfinished streamed jobs by caller (``caller_id``)
        self.scheduler.start()

    def _job_id(self, job_id: str) -> str:
        """The scheduler's id of one of this replica's job ids.

        Raises:
            UnknownJobError: the id names another replica, or none.
        """
        if job_replica(job_id) != self.replica_id:
            raise UnknownJobError(job_id)
        return job_id.rpartition(SEPARATOR)[2]

    def _outward(self, described: dict[str, Any]) -> dict[str, Any]:
        return {
            **described,
            "id": f"{self.replica_id}{SEPARATOR}{described['id']}",
            "replica": self.replica_id,
        }

    def submit(self, data: Any) -> dict[str, Any]:
        """Check and queue a request (``modular/serving/requests.py``); the job as ``describe`` gives it.

        Raises:
            QueueFullError, RequestError and the input errors of ``Scheduler.submit``.
        """
        job = self.scheduler.submit(data)
        return self.describe(f"{self.replica_id}{SEPARATOR}{job.id}")

    def describe(self, job_id: str) -> dict[str, Any]:
        """The job as the HTTP API describes it, its id naming this replica, with ``replica`` (this replica's id).

        Raises:
            UnknownJobError: no job of this replica has this id.
        """
        return self._outward(self.scheduler.describe(self._job_id(job_id)))

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a waiting job (at once) or the running one (before its next step); the job as described.

        Raises:
            UnknownJobError: no job of this replica has this id. JobStateError: it has finished already.
        """
        own = self._job_id(job_id)
        self.scheduler.cancel(own)
        return self._outward(self.scheduler.describe(own))

    def result(self, job_id: str, index: int) -> bytes:
        """The PNG bytes of image ``index`` of a job.

        Raises:
            UnknownJobError: no job of this replica has this id.
            LookupError: the job has no such image (yet, or at all).
        """
        names = self.scheduler.describe(self._job_id(job_id))["results"]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(names):
            raise LookupError(f"job {job_id!r} has {len(names)} image(s) so far; there is no image {index!r}")
        return (self.scheduler.results / names[index]).read_bytes()

    async def run(
        self, data: Any, images: Mapping[str, tuple[str, bytes]] | None = None, caller: str | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Queue a request and stream its events until its final one: first ``assigned`` (``replica``,
        ``replica_job``: the job's id here), then the scheduler's events of the job, the final ``done`` with
        ``images`` (each result's PNG bytes) and a final ``failed`` with ``unloadable`` when the workflow could
        not load here. A stream closed before the job finished cancels it: its images would reach no one.

        Args:
            data: The request in normal form (``CheckedRequest.data``: its seed recorded).
            images: Input images by input name: (the name the ingress stored them under, their bytes).
            caller: The caller's ``caller_id``: the replica's report counts its unfinished streams apart
                (``ResidencyReport.streamed``), for the routers in its process that follow them as they go.

        Raises:
            QueueFullError, RequestError and the input errors of ``Scheduler.submit``; ValueError: an image
            name that is not one the ingress makes.
        """
        uploads = self._store_uploads(images or {})
        job = self.scheduler.submit(data, uploads)
        listener = self.scheduler.events.subscribe(job.id)
        outward = f"{self.replica_id}{SEPARATOR}{job.id}"
        finished = False
        caller = str(caller) if caller is not None else None
        if caller is not None:
            self._streamed[caller] += 1
        try:
            yield {"kind": "assigned", "replica": self.replica_id, "replica_job": outward}
            while True:
                event = listener.get(timeout=0)
                if event is None:
                    if self._closed:  # as a dead replica's stream breaks: the ingress sends the job again
                        raise ReplicaClosedError(
                            f"replica {self.replica_id} closed before job {outward} ended"
                        )
                    await asyncio.sleep(POLL)
                    continue
                kind = event["kind"]
                event = {**event, "job": outward, "replica": self.replica_id}
                if kind == "done":
                    event["images"] = [(self.scheduler.results / name).read_bytes() for name in job.results]
                elif kind == "failed":
                    event["unloadable"] = job.workflow in self.scheduler.residency_report().unloadable
                finished = kind in FINAL_KINDS
                yield event
                if finished:
                    return
        finally:
            listener.close()
            if caller is not None:
                self._streamed[caller] -= 1
                if not self._streamed[caller]:
                    del self._streamed[caller]
            if not finished and not self._closed:
                try:
                    self.scheduler.cancel(job.id, "the ingress stopped listening")
                except (UnknownJobError, JobStateError):
                    pass

    def _store_uploads(self, images: Mapping[str, tuple[str, bytes]]) -> dict[str, Path]:
        uploads = {}
        for name, (stored, data) in images.items():
            if not isinstance(stored, str) or not _UPLOAD_NAME.match(stored):
                raise ValueError(f"image {name!r}: {stored!r} is not a name the ingress gives an upload")
            if not isinstance(data, bytes) or hashlib.sha256(data).hexdigest() != stored.split(".")[0]:
                raise ValueError(f"image {name!r}: its bytes are not those its name {stored!r} was made from")
            path = self.scheduler.uploads / stored
            if not path.is_file():
                write_result(self.scheduler.uploads, stored, data)
            uploads[name] = path
        return uploads

    def _mine(self, replica: Any) -> LocalJobs:
        """This replica's scheduler as a ``JobService``, for a call addressed to ``replica``.

        Raises:
            UnknownReplicaError: ``replica`` is not this replica's id.
        """
        if replica != self.replica_id:
            raise UnknownReplicaError(replica, self.replica_id)
        return LocalJobs(self.scheduler)

    def queue(self, replica: str) -> dict[str, Any]:
        """This replica's queue (``JobService.queue``), its job ids naming this replica."""
        queue = self._mine(replica).queue()
        outward = [f"{self.replica_id}{SEPARATOR}{job_id}" for job_id in queue["waiting"]]
        running = queue["running"]
        return {
            **queue,
            "waiting": outward,
            "running": None if running is None else f"{self.replica_id}{SEPARATOR}{running}",
        }

    def pause(self, replica: str) -> None:
        """Start no new job on this replica until ``resume``."""
        self._mine(replica).pause()

    def resume(self, replica: str) -> None:
        self._mine(replica).resume()

    def components(self, replica: str) -> list[dict[str, Any]]:
        """This replica's loaded components (``JobService.components``)."""
        return self._mine(replica).components()

    def manager_text(self, replica: str) -> str:
        """This replica's manager table as it prints."""
        return self._mine(replica).manager_text()

    def memory(self, replica: str) -> dict[str, Any]:
        """This replica's devices and host bytes (``JobService.memory``)."""
        return self._mine(replica).memory()

    def needs(self) -> dict[str, dict[str, int]]:
        """``needs_table`` of this replica's workflows."""
        return needs_table(self.served)

    def record_routing_stats(self) -> dict[str, Any]:
        """What Ray Serve hands this replica's router as ``routing_stats``: the scheduler's residency report
        (``ResidencyReport.as_dict``, with the streams each caller follows) and ``replica``, this replica's id."""
        report = attrs.evolve(self.scheduler.residency_report(), streamed=dict(self._streamed))
        return {**report.as_dict(), "replica": self.replica_id}

    def moved_bytes(self) -> dict[str, Any]:
        """What auto offload has moved to this replica's device since it started: ``bytes_to_device`` (the
        offload log's ``total_bytes_to_device``, every device summed; 0 with offload off) and ``replica``, this
        replica's id (a call without a replica id reaches any replica: the id says which answered)."""
        log = self.manager.offload_log
        return {
            "bytes_to_device": 0 if log is None else log.total_bytes_to_device,
            "replica": self.replica_id,
        }

    def check_health(self) -> None:
        """Ray Serve's health check: the scheduler's worker thread must be alive.

        Raises:
            RuntimeError: it is not (the replica is restarted).
        """
        worker = self.scheduler._worker
        if worker is None or not worker.is_alive():
            raise RuntimeError(f"replica {self.replica_id}: the scheduler's worker has stopped")

    def close(self) -> None:
        """Stop the scheduler (the running job is requeued in its store) and close it; again: nothing."""
        if not self._closed:
            self._closed = True
            self.scheduler.close()

    def __del__(self) -> None:  # Ray Serve deletes the replica's object when the replica stops
        if getattr(self, "_closed", True) is False:
            self.close()
