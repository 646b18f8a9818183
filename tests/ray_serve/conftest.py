"""Fixtures of the Ray Serve tests: the serving tests' tiny repos, workflows and direct calls, a wait for a
replica's job to finish, ``routed`` (an ingress over replicas of this process, no Ray) and ``local_cluster``
(a local Ray cluster, one per module that asks for it)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest

from components import ComponentsManager
from modular.ray_serve.ingress import RoutedJobs
from modular.ray_serve.local_workers import LocalWorkers
from modular.ray_serve.worker import ReplicaWorker
from modular.serving import ServedWorkflows
from tests.http.helpers import HoldingHub
from tests.http.test_cli_serve import start_serve  # noqa: F401  (a fixture: modular serve in a subprocess)
from tests.serving.conftest import SMALL, WAIT, direct, serving_repos, sizes, workflows
from tests.threads import threads_left

__all__ = [
    "SMALL",
    "WAIT",
    "Routed",
    "direct",
    "finished",
    "free_port",
    "local_cluster",
    "routed",
    "serving_repos",
    "sizes",
    "workflows",
]

FINISHED = ("done", "failed", "cancelled")


def finished(describe: Callable[[str], dict[str, Any]], job_id: str, timeout: float = WAIT) -> dict[str, Any]:
    """Ask ``describe(job_id)`` until the job has finished (at most ``timeout`` seconds); its last description."""
    deadline = time.monotonic() + timeout
    while True:
        described = describe(job_id)
        if described["state"] in FINISHED or time.monotonic() > deadline:
            return described
        time.sleep(0.05)


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Routed(NamedTuple):
    """An ingress over replicas of this process: the jobs, the workers, each replica by id, and each
    replica's hub (a ``HoldingHub``: the replica's first ``step`` waits until the test sets its ``release``;
    set already unless asked to hold)."""

    jobs: RoutedJobs
    workers: LocalWorkers
    replicas: dict[str, ReplicaWorker]
    hubs: dict[str, HoldingHub]


@pytest.fixture
def routed(workflows, sizes) -> Iterator[Callable[..., Routed]]:
    """``routed(*names, budgets=None, hold=(), tries=3, max_queue=100, limits=None, **worker_options)``: a
    ``RoutedJobs`` over ``LocalWorkers`` of replicas ``r1``, ``r2``... (one per budget; default two, each
    device holding the largest family), serving the named workflows (default ``sd`` and ``flux``). The
    replicas named in ``hold`` stop at their first step until released. Everything made is closed at
    teardown (the holds released first)."""
    made: list[Routed] = []
    threads_before = set(threading.enumerate())

    def make(
        *names: str,
        budgets: tuple[int, ...] | None = None,
        hold: tuple[str, ...] = (),
        tries: int = 3,
        max_queue: int = 100,
        limits: Any = None,
        **options: Any,
    ) -> Routed:
        chosen = [workflows[name] for name in names or ("sd", "flux")]
        budgets = budgets or (max(sizes.values()),) * 2
        options.setdefault("preview_every", None)
        hubs, replicas = {}, {}
        try:
            for number, budget in enumerate(budgets, 1):
                replica = f"r{number}"
                hubs[replica] = HoldingHub(timeout=WAIT)
                if replica not in hold:
                    hubs[replica].release.set()
                replicas[replica] = ReplicaWorker(
                    chosen, budget, replica_id=replica, events=hubs[replica], limits=limits, **options
                )
            workers = LocalWorkers(list(replicas.values()))
            served = ServedWorkflows(chosen, ComponentsManager())  # bound to check requests only
            jobs = RoutedJobs(served, workers, limits=limits, max_queue=max_queue, tries=tries)
        except BaseException:
            for replica in replicas.values():
                replica.close()
            raise
        made.append(Routed(jobs, workers, replicas, hubs))
        return made[-1]

    yield make
    for one in reversed(made):
        for hub in one.hubs.values():
            hub.release.set()
        one.jobs.close()
        one.workers.close()
    assert threads_left(threads_before, WAIT) == []  # a prefetch may still be finishing its load


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[int]:
    """A local Ray cluster on loopback (two CPUs) with Ray Serve's HTTP proxy on a free loopback port; the
    port. Shut down when the module's tests are done (one cluster at a time)."""
    pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')
    import ray
    from ray import serve

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
