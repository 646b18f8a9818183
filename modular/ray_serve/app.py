"""``build_app``: the worker deployment of ``modular/ray_serve/worker.py`` routed by
``modular/ray_serve/router.py``, bound for ``serve.run``. Imports Ray (imported only when named).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from components import ComponentsManager
from modular.ray_serve.router import ResidencyRouter, router_kwargs
from modular.ray_serve.worker import ReplicaWorker, needs_table, served_workflows
from modular.serving.served import ServedWorkflow, ServedWorkflows

__all__ = ["DEPLOYMENT", "build_app"]

DEPLOYMENT = "ModularWorker"


def build_app(
    workflows: Sequence[ServedWorkflow | str],
    replicas: int = 2,
    budget: int | None = None,
    imbalance: int = 8,
    stats_period: float = 1.0,
    *,
    base: str | Path = ".",
    num_gpus: float | None = None,
    num_cpus: float = 1,
    max_ongoing_requests: int = 16,
    **worker_options: Any,
) -> Application:
    """The worker deployment with ``replicas`` replicas, each a ``ReplicaWorker`` of ``workflows``, routed by
    residency; ``serve.run(build_app(...))`` returns the handle whose ``submit``, ``describe``, ``cancel`` and
    ``result`` reach the replicas.

    Args:
        workflows: What every replica serves (``ServedWorkflow`` or ``REPO``, ``REPO:WORKFLOW``,
            ``NAME=REPO[:WORKFLOW]``); local repos are read here once to make the router's table of needs,
            and by each replica from the same path.
        replicas: Replicas of the worker.
        budget: Each replica's simulated device, in bytes; ``None``: each replica's own GPU.
        imbalance: Jobs by which the replicas' queues may differ before the router sends by queue length.
        stats_period: Seconds between two residency reports of a replica.
        base: The folder relative repos are read from.
        num_gpus: GPUs per replica (default 1 without a budget, 0 with one).
        num_cpus: CPUs per replica, as Ray schedules them.
        max_ongoing_requests: Calls one replica takes at once (each returns at once: jobs queue in its
            scheduler).
        worker_options: Passed to each replica's ``Scheduler`` (``limits``, ``fairness``, ``preview_every``, ...).

    Raises:
        ValueError: no workflow, two with one name, a bad count or threshold.
        FileNotFoundError, JobFileError: a repo that cannot be read.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a whole number of at least 1 (got {replicas!r})")
    if not stats_period > 0:
        raise ValueError(f"stats_period must be a positive number of seconds (got {stats_period!r})")
    base = Path(base).resolve()
    chosen = served_workflows(workflows)
    kwargs = router_kwargs(needs_table(ServedWorkflows(chosen, ComponentsManager(), base)), imbalance)
    gpus = num_gpus if num_gpus is not None else (0 if budget is not None else 1)
    deployment = serve.deployment(
        ReplicaWorker,
        name=DEPLOYMENT,
        num_replicas=replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": gpus},
        request_router_config=RequestRouterConfig(
            request_router_class=ResidencyRouter,
            request_router_kwargs=kwargs,
            request_routing_stats_period_s=stats_period,
        ),
    )
    return deployment.bind(chosen, budget, base=str(base), **worker_options)
