"""Serving: a queue of jobs over one ComponentsManager, ordered by what the device holds, durable in SQLite.
May import `modular.batch` and below.

``ServedWorkflows`` names what a server runs; ``Scheduler`` accepts requests (the batch job format narrowed
to one prompt), orders them by fairness, priority and the bytes each would bring to the device, runs them
one at a time with cancel, timeouts, progress and previews, and publishes events. See docs/serving.md.
"""

from typing import TYPE_CHECKING

from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from modular.serving.events import EventHub, Listener
    from modular.serving.jobs import JobStateError, QueueFullError, ServedJob, UnknownJobError
    from modular.serving.policy import Fairness
    from modular.serving.requests import CheckedRequest, Limits, RequestError, check_request
    from modular.serving.residency import ResidencyReport, rank_replicas, replica_report, workflow_needs
    from modular.serving.scheduler import Scheduler
    from modular.serving.served import ServedWorkflow, ServedWorkflows, parse_served
    from modular.serving.store import JobRecord, JobStore, StateFolderInUseError

# Each name is imported on first use (PEP 562): `modular --help` does not import the scheduler.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "CheckedRequest",
    "EventHub",
    "Fairness",
    "JobRecord",
    "JobStateError",
    "JobStore",
    "Limits",
    "Listener",
    "QueueFullError",
    "RequestError",
    "ResidencyReport",
    "Scheduler",
    "ServedJob",
    "ServedWorkflow",
    "ServedWorkflows",
    "StateFolderInUseError",
    "UnknownJobError",
    "check_request",
    "rank_replicas",
    "replica_report",
    "parse_served",
    "workflow_needs",
]
