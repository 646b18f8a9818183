"""The worker deployment on a local Ray cluster (loopback only, two CPUs), routed by residency: two
replicas on simulated devices. Skipped where Ray Serve is not installed (``pip install ".[ray]"``)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')

from ray import serve

from modular.ray_serve import build_workers, job_replica
from modular.serving import ResidencyReport

from .conftest import SMALL, WAIT, finished

STATS_PERIOD = 0.5
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def handle(local_cluster, workflows, sizes):
    """The deployment: two replicas serving sd and flux, each device holding one family."""
    app = build_workers(
        [workflows["sd"], workflows["flux"]],
        replicas=2,
        budget=max(sizes["sd"], sizes["flux"]),
        stats_period=STATS_PERIOD,
        num_cpus=0.5,
        preview_every=None,
    )
    return serve.run(app, name="modular", route_prefix=None)


def call(handle, method, *args):
    return getattr(handle, method).remote(*args).result(timeout_s=WAIT)


def run(handle, request):
    """Submit ``request`` through Ray and wait for it: (the job as first described, as finished)."""
    job = call(handle, "submit", request)
    done = finished(lambda job_id: call(handle, "describe", job_id), job["id"])
    assert done["state"] == "done", done
    return job, done


def settle():
    """Wait for each replica's next residency report to reach the router."""
    time.sleep(4 * STATS_PERIOD)


def test_results_through_ray_equal_the_direct_call(handle, direct):
    request = {**SMALL, "workflow": "sd", "seed": 7}
    job, done = run(handle, request)
    assert done["replica"] == job["replica"] == job_replica(job["id"])
    assert call(handle, "result", job["id"], 0) == direct(request)[0]


def test_repeat_jobs_of_a_repo_go_to_the_replica_holding_it(handle):
    first, _ = run(handle, {**SMALL, "workflow": "flux", "seed": 1})
    settle()
    for seed in (2, 3, 4, 5, 6):  # by chance (two replicas, equal queues): 1 in 32
        job, done = run(handle, {**SMALL, "workflow": "flux", "seed": seed})
        assert job["replica"] == done["replica"] == first["replica"], (seed, job["replica"], first["replica"])
        settle()


def test_a_replicas_report_after_a_job_names_its_models_with_nothing_to_move(handle):
    job, _ = run(handle, {**SMALL, "workflow": "sd", "seed": 5})
    needs = call(handle, "needs")["sd"]
    settle()
    # The router reads what Ray last recorded of each replica; ask the replica that ran the job for its own.
    replicas = {}
    deadline = time.monotonic() + WAIT
    while job["replica"] not in replicas and time.monotonic() < deadline:
        stats = call(handle, "record_routing_stats")
        replicas[stats["replica"]] = stats
    report = ResidencyReport.from_dict(replicas[job["replica"]])
    assert set(needs) <= set(report.missing)
    assert report.bytes_for(needs) == 0
    assert all(report.missing[load_id] == 0 for load_id in needs)
