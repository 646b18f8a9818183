"""Serving on Ray Serve: replicas of the scheduler, each with its own device and manager, and a router that
sends each job to the replica that would move the fewest bytes for it. May import `modular.http` and below.

``ReplicaWorker`` (``modular/ray_serve/worker.py``) is one replica: a ``ComponentsManager``, the served
workflows and a started ``Scheduler``, reporting what it holds through ``record_routing_stats``; it is a plain
class, so it runs (and is tested) without Ray. ``ResidencyRouter`` (``modular/ray_serve/router.py``) ranks
the replicas by those reports; ``build_app`` (``modular/ray_serve/app.py``) binds the two for ``serve.run``.
Ray Serve is the optional extra ``ray``: nothing here imports it until ``ResidencyRouter`` or ``build_app``
is named. See docs/serving.md ("More than one machine: Ray Serve").
"""

from typing import TYPE_CHECKING

from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from modular.ray_serve.app import build_app, build_workers
    from modular.ray_serve.ingress import RoutedJobs
    from modular.ray_serve.local_workers import LocalWorkers
    from modular.ray_serve.router import ResidencyRouter
    from modular.ray_serve.worker import ReplicaWorker, job_replica, needs_table

__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "LocalWorkers",
    "ReplicaWorker",
    "ResidencyRouter",
    "RoutedJobs",
    "build_app",
    "build_workers",
    "job_replica",
    "needs_table",
]
