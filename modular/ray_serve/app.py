"""``build_app``: the Ray Serve application of ``modular serve --ray``. An ingress deployment serves the HTTP
app of ``modular serve`` (``@serve.ingress``: the same routes and page) over ``RoutedJobs``; it sends each
job to the worker deployment (``ReplicaWorker`` replicas, each with its own device, manager and scheduler)
through a handle routed by ``ResidencyRouter``. Imports Ray (imported only when named).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from components import ComponentsManager
from modular.http.app import make_app
from modular.http.settings import ServerSettings
from modular.ray_serve.ingress import RoutedJobs
from modular.ray_serve.registry import deployment_replicas
from modular.ray_serve.router import ResidencyRouter, router_kwargs
from modular.ray_serve.worker import ReplicaWorker, caller_id, needs_table, served_workflows
from modular.serving.events import FINAL_KINDS
from modular.serving.requests import Limits
from modular.serving.residency import DEFAULT_IMBALANCE
from modular.serving.served import ServedWorkflow, ServedWorkflows

__all__ = ["DEPLOYMENT", "INGRESS", "Ingress", "RayWorkers", "build_app", "build_workers"]

DEPLOYMENT = "ModularWorker"
INGRESS = "ModularIngress"
# Calls a worker replica takes beyond its jobs' streams (each open while its job is unfinished): cancel,
# pause, the queue, the manager. Ray counts both against ``max_ongoing_requests``; without room a cancel
# would wait until the streams, the job it cancels among them, had ended.
CONTROL_CALLS = 32


class RayWorkers:
    """The worker deployment behind ``handle`` as the ingress's ``Workers`` (``modular/ray_serve/ingress.py``)."""

    def __init__(self, handle: DeploymentHandle, app_name: str) -> None:
        self.handle = handle
        self.app_name = app_name

    async def run(
        self, data: Mapping[str, Any], images: Mapping[str, tuple[str, bytes]]
    ) -> AsyncIterator[dict[str, Any]]:
        # caller: the replica's report then counts this process's streams apart (its routers follow them)
        stream = cast(
            Any, self.handle.options(stream=True).run.remote(dict(data), dict(images), caller=caller_id())
        )
        ended = False
        try:
            async for event in stream:
                ended = event.get("kind") in FINAL_KINDS
                yield event
            ended = True
        finally:
            if not ended:  # left mid-job (the ingress closed): Ray cancels the call, and the replica the job
                stream.cancel()  # (``ReplicaWorker.run``), as a closed stream of ``LocalWorkers`` does

    async def call(self, replica: str, method: str, *args: Any) -> Any:
        # The router sends a job method to the replica its job id names, a replica method to ``args[0]``.
        return await getattr(self.handle, method).remote(*args)

    def replicas(self) -> list[str]:
        found = deployment_replicas(self.app_name)
        if found is None:  # no call has gone yet, so Ray has not started this handle's router: send one
            self.handle.needs.remote().result(timeout_s=30)
            found = deployment_replicas(self.app_name) or []
        return found


class Ingress:
    """The ingress deployment: ``RoutedJobs`` over the workers, served by ``make_app`` (see ``build_app``)."""

    def __init__(
        self,
        workers: DeploymentHandle,
        workflows: Sequence[ServedWorkflow],
        base: str,
        settings: ServerSettings,
        limits: Limits | None,
        max_queue: int,
        tries: int,
    ) -> None:
        served = ServedWorkflows(list(workflows), ComponentsManager(), base)  # bound to check requests only
        app_name = serve.get_replica_context().app_name
        self.settings = settings
        self.jobs = RoutedJobs(
            served, RayWorkers(workers, app_name), limits=limits, max_queue=max_queue, tries=tries
        )

    def __serve_build_asgi_app__(self) -> Any:  # Ray Serve's hook: the app, made once the jobs exist
        return make_app(self.jobs, self.settings)

    def __del__(self) -> None:  # Ray Serve deletes the replica's object when the replica stops
        jobs = getattr(self, "jobs", None)
        if jobs is not None:
            jobs.close()


def build_workers(
    workflows: Sequence[ServedWorkflow | str],
    replicas: int = 2,
    budget: int | None = None,
    imbalance: float = DEFAULT_IMBALANCE,
    stats_period: float = 1.0,
    *,
    base: str | Path = ".",
    num_gpus: float | None = None,
    num_cpus: float = 1,
    max_ongoing_requests: int = 100,
    router: bool = True,
    autoscaling: Mapping[str, Any] | None = None,
    **worker_options: Any,
) -> Application:
    """The worker deployment alone, bound: ``serve.run(build_workers(...))`` returns its handle, whose
    ``submit``, ``describe``, ``cancel``, ``result`` and ``run`` reach the replicas (for a program that
    brings its own front). Arguments as ``build_app``'s."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a whole number of at least 1 (got {replicas!r})")
    if not stats_period > 0:
        raise ValueError(f"stats_period must be a positive number of seconds (got {stats_period!r})")
    base = Path(base).resolve()
    chosen = served_workflows(workflows)
    kwargs = router_kwargs(needs_table(ServedWorkflows(chosen, ComponentsManager(), base)), imbalance)
    gpus = num_gpus if num_gpus is not None else (0 if budget is not None else 1)
    options: dict[str, Any] = {
        "name": DEPLOYMENT,
        "max_ongoing_requests": max_ongoing_requests,
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": gpus},
    }
    if autoscaling is not None:
        options["autoscaling_config"] = dict(autoscaling)
    else:
        options["num_replicas"] = replicas
    if router:  # else Ray's default router (power of two choices): the benchmark's baseline
        options["request_router_config"] = cast(Any, RequestRouterConfig)(
            request_router_class=ResidencyRouter,
            request_router_kwargs=kwargs,
            request_routing_stats_period_s=stats_period,
        )
    deployment = cast(Any, serve.deployment)(ReplicaWorker, **options)
    return deployment.bind(chosen, budget, base=str(base), **worker_options)


def build_app(
    workflows: Sequence[ServedWorkflow | str],
    replicas: int = 2,
    budget: int | None = None,
    imbalance: float = DEFAULT_IMBALANCE,
    stats_period: float = 1.0,
    *,
    base: str | Path = ".",
    settings: ServerSettings | None = None,
    limits: Limits | None = None,
    max_queue: int = 100,
    tries: int = 3,
    num_gpus: float | None = None,
    num_cpus: float = 1,
    router: bool = True,
    autoscaling: Mapping[str, Any] | None = None,
    **worker_options: Any,
) -> Application:
    """The application of ``modular serve --ray``: ``serve.run(build_app(...), route_prefix="/")`` serves
    the HTTP API and page of ``modular serve`` on Ray Serve's proxy, over ``replicas`` worker replicas
    routed by residency.

    Args:
        workflows: What every replica serves (``ServedWorkflow`` or ``REPO``, ``REPO:WORKFLOW``,
            ``NAME=REPO[:WORKFLOW]``); local repos are read here once to make the router's table of needs,
            and by each replica (and the ingress) from the same path.
        replicas: Worker replicas (ignored with ``autoscaling``).
        budget: Each replica's simulated device, in bytes; ``None``: each replica's own GPU.
        imbalance: Job times by which a replica's expected wait may exceed the shortest and the router still
            choose it for the models it holds (``rank_replicas``).
        stats_period: Seconds between two residency reports of a replica.
        base: The folder relative repos are read from.
        settings: The token and the body limits (``ServerSettings``; Ray's proxy binds the address). The
            token is read here (``--token`` or ``MODULAR_SERVE_TOKEN``) and given to the ingress.
        limits: What one request may ask for, at the ingress and on every replica.
        max_queue: Unfinished jobs the ingress holds (and each replica takes) before it answers 429.
        tries: Tries of one job before it fails (a replica lost while running it, or one that cannot load it).
        num_gpus: GPUs per replica (default 1 without a budget, 0 with one).
        num_cpus: CPUs per worker replica, as Ray schedules them.
        router: ``False``: Ray's default router (power of two choices) instead of the residency router.
        autoscaling: Ray Serve's ``autoscaling_config`` of the workers (``min_replicas``, ``max_replicas``,
            ``target_ongoing_requests``, ...), in place of a fixed count.
        worker_options: Passed to each replica's ``Scheduler`` (``fairness``, ``preview_every``, ...).

    Raises:
        ValueError: no workflow, two with one name, a bad count, threshold or setting.
        FileNotFoundError, JobFileError: a repo that cannot be read.
    """
    settings = settings or ServerSettings()
    token = settings.resolved_token()
    settings = ServerSettings(settings.host, settings.port, token, settings.max_body, settings.max_upload)
    settings.check()
    chosen = served_workflows(workflows)
    workers = build_workers(
        chosen,
        replicas,
        budget,
        imbalance,
        stats_period,
        base=base,
        num_gpus=num_gpus,
        num_cpus=num_cpus,
        max_ongoing_requests=max_queue + CONTROL_CALLS,
        router=router,
        autoscaling=autoscaling,
        limits=limits,
        max_queue=max_queue,
        **worker_options,
    )
    ingress = cast(Any, serve.deployment)(serve.ingress()(Ingress), name=INGRESS, num_replicas=1)
    ingress_options = {"ray_actor_options": {"num_cpus": 0}}
    return ingress.options(**ingress_options).bind(
        workers, chosen, str(Path(base).resolve()), settings, limits, max_queue, tries
    )
