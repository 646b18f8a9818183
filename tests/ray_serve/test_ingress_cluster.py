"""``build_app`` on a local Ray cluster (loopback, two CPUs), through Ray Serve's HTTP proxy on a free loopback
port: the HTTP API of ``modular serve`` over two worker replicas on simulated devices, routed by residency.
Results, routing, each replica's report, events, the token and limits, pause and cancel, and a replica killed
mid-job. Skipped where Ray Serve is not installed. (The worker deployment alone, ``build_workers``, runs on a local
cluster in the serving benchmark's quick run: tests/test_benchmarks.py.)"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')

import httpx
import ray
from ray import serve
from ray.serve import RunTarget

from modular.http import ServerSettings
from modular.ray_serve import build_app
from modular.ray_serve.app import DEPLOYMENT, RayWorkers
from modular.serving import ResidencyReport
from tests.http.helpers import TOKEN, read_events, wait_for_state
from tests.http.test_api import input_image

from .conftest import SMALL

pytestmark = pytest.mark.slow
STATS_PERIOD = 0.5
WAIT = 120.0  # seconds any wait here gives up after: replicas start and run on two shared CPUs
APP = "modular"
MAX_BODY = 100_000


def request(workflow: str = "sd", seed: int = 7, **more: Any) -> dict[str, Any]:
    return {**SMALL, "workflow": workflow, "seed": seed, **more}


def app(
    workflows, sizes, name: str, prefix: str, replicas: int, tries: int, max_queue: int = 100
) -> RunTarget:
    built = build_app(
        [workflows["sd"], workflows["flux"]],
        replicas=replicas,
        budget=max(sizes["sd"], sizes["flux"]),
        stats_period=STATS_PERIOD,
        num_cpus=0.5,
        settings=ServerSettings(token=TOKEN, max_body=MAX_BODY),
        tries=tries,
        max_queue=max_queue,
        preview_every=None,
    )
    return RunTarget(built, name=name, route_prefix=prefix)


@pytest.fixture(scope="module")
def client(local_cluster, workflows, sizes) -> Iterator[httpx.Client]:
    """A client (with the token) of the app: two worker replicas, three tries, served at ``/``. The second app
    (``small``, below) is deployed with it: both start at once, not one after the other (seconds each)."""
    serve.run_many(
        [
            app(workflows, sizes, APP, "/", replicas=2, tries=3),
            app(workflows, sizes, "small", "/small", replicas=1, tries=1, max_queue=1),
        ]
    )
    with httpx.Client(
        base_url=f"http://127.0.0.1:{local_cluster}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=WAIT,
    ) as made:
        yield made


def run(client: httpx.Client, job: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=job)
    assert response.status_code == 202, response.text
    done = wait_for_state(client, response.json()["id"], timeout=WAIT)
    assert done["state"] == "done", done
    return done


def base(client: httpx.Client) -> str:
    return str(client.base_url).rstrip("/")


def settle() -> None:
    """Wait for each replica's next residency report to reach the router."""
    time.sleep(4 * STATS_PERIOD)


def kill(app: str, replica: str) -> None:
    actor = ray.get_actor(f"SERVE_REPLICA::{app}#{DEPLOYMENT}#{replica}", namespace="serve")
    ray.kill(actor, no_restart=True)


def running(client: httpx.Client, job_id: str) -> dict[str, Any]:
    """Wait until the job runs on a replica, past its first step; its description."""
    deadline = time.monotonic() + WAIT
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] == "running" and (job["progress"].get("step") or 0) >= 1:
            return job
        assert job["state"] not in ("done", "failed", "cancelled"), job
        assert time.monotonic() < deadline, f"job {job_id} is still {job['state']}"
        time.sleep(0.05)


def test_a_result_over_http_equals_the_direct_call(client, direct):
    done = run(client, request(seed=7))
    assert done["replica"] and done["attempts"] == 1
    result = client.get(f"/v1/jobs/{done['id']}/result")
    assert result.status_code == 200 and result.headers["content-type"] == "image/png"
    assert result.content == direct(request(seed=7))[0]


def test_an_uploaded_image_reaches_the_replica(client, direct, tmp_path):
    image = input_image(5)
    asked = {"workflow": "sd", "prompt": "a fox", "steps": 2, "seed": 4, "inputs": {"strength": 0.6}}
    response = client.post(
        "/v1/jobs", data={"request": json.dumps(asked)}, files={"image": ("a.png", image, "image/png")}
    )
    assert response.status_code == 202, response.text
    done = wait_for_state(client, response.json()["id"], timeout=WAIT)
    assert done["state"] == "done", done
    local = tmp_path / "input.png"
    local.write_bytes(image)
    assert client.get(f"/v1/jobs/{done['id']}/result").content == direct(asked, {"image": local})[0]


def test_repeat_jobs_of_a_repo_go_to_the_replica_holding_it(client):
    first = run(client, request("flux", seed=1))
    settle()
    for seed in (2, 3, 4, 5, 6):  # by chance (two replicas, equal queues): 1 in 32
        assert run(client, request("flux", seed=seed))["replica"] == first["replica"], seed
        settle()
    queue = client.get("/v1/queue").json()
    assert first["replica"] in queue["replicas"] and len(queue["replicas"]) == 2


def test_a_replicas_report_after_a_job_names_its_models_with_nothing_to_move(client):
    """The replica that ran a job reports (what Ray hands the router) every model of its workflow as resident:
    nothing to move for a repeat job."""
    done = run(client, request("sd", seed=5))
    workers = serve.get_deployment_handle(DEPLOYMENT, app_name=APP)
    needs = workers.needs.remote().result(timeout_s=WAIT)["sd"]
    settle()
    # The router reads what Ray last recorded of each replica; ask the replica that ran the job for its own.
    replicas: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + WAIT
    while done["replica"] not in replicas and time.monotonic() < deadline:
        stats = workers.record_routing_stats.remote().result(timeout_s=WAIT)
        replicas[stats["replica"]] = stats
    report = ResidencyReport.from_dict(replicas[done["replica"]])
    assert set(needs) <= set(report.missing)
    assert report.bytes_for(needs) == 0
    assert all(report.missing[load_id] == 0 for load_id in needs)


def test_events_stream_from_the_replica_through_the_ingress(client):
    job_id = client.post("/v1/jobs", json=request(seed=9, steps=3)).json()["id"]
    events = read_events(client, f"/v1/jobs/{job_id}/events", timeout=WAIT)
    kinds = [event["kind"] for event in events if event["kind"] != "position"]
    assert kinds[:3] == ["queued", "assigned", "started"] and kinds[-1] == "done", kinds
    steps = [event for event in events if event["kind"] == "step"]
    assert steps and steps[-1]["step"] == steps[-1]["total"], steps
    replica = client.get(f"/v1/jobs/{job_id}").json()["replica"]
    assert all(event["replica"] == replica for event in events[1:])


def test_the_token_and_the_body_limit_are_enforced(client):
    stranger = httpx.get(f"{base(client)}/v1/queue", timeout=WAIT)
    assert stranger.status_code == 401 and stranger.json()["error"]["type"] == "Unauthorized"
    assert httpx.get(f"{base(client)}/healthz", timeout=WAIT).json() == {"ok": True}
    big = client.post("/v1/jobs", json=request(prompt="x" * (MAX_BODY + 1)))
    assert big.status_code == 413, big.text
    unknown = client.post("/v1/jobs", json=request("nope"))
    assert unknown.status_code == 400 and unknown.json()["error"]["type"] == "RequestError"


def test_pause_holds_jobs_cancel_ends_one_and_resume_runs_the_other(client):
    assert client.post("/v1/queue/pause").json() == {"paused": True}
    try:
        held = client.post("/v1/jobs", json=request(seed=21)).json()["id"]
        other = client.post("/v1/jobs", json=request(seed=22)).json()["id"]
        time.sleep(1.0)  # long enough to start, were it sent
        assert client.get(f"/v1/jobs/{held}").json()["replica"] is None
        assert client.get("/v1/queue").json()["paused"] is True
        assert client.delete(f"/v1/jobs/{held}").json()["state"] == "cancelled"
    finally:
        assert client.post("/v1/queue/resume").json() == {"paused": False}
    assert wait_for_state(client, other, timeout=WAIT)["state"] == "done"
    assert client.get(f"/v1/jobs/{held}").json()["state"] == "cancelled"


def test_a_running_job_is_cancelled_on_its_replica(client):
    job_id = client.post("/v1/jobs", json=request(seed=23, steps=40)).json()["id"]
    running(client, job_id)
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 202
    done = wait_for_state(client, job_id, timeout=WAIT)
    assert done["state"] == "cancelled" and done["results"] == [], done


def test_a_stream_left_mid_job_cancels_the_job_on_its_replica(client):
    """What the ingress's close does to a job it drives: its stream is left, and the replica cancels it."""
    handle = serve.get_deployment_handle(DEPLOYMENT, app_name=APP)
    workers = RayWorkers(handle, APP)

    async def leave_after_a_step() -> str:
        stream = workers.run(request(seed=41, steps=40), {})
        try:
            async for event in stream:
                if event["kind"] == "step":
                    return str(event["job"])
        finally:
            await stream.aclose()
        raise AssertionError("the job ended before its first step")

    replica_job = asyncio.run(asyncio.wait_for(leave_after_a_step(), WAIT))
    deadline = time.monotonic() + WAIT
    while (job := handle.describe.remote(replica_job).result(timeout_s=WAIT))["state"] == "running":
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["state"] == "cancelled" and job["error"] == "the ingress stopped listening", job


def test_a_replica_killed_mid_job_leaves_the_job_to_the_other_with_one_result(client):
    job_id = client.post("/v1/jobs", json=request(seed=31, steps=12)).json()["id"]
    lost = running(client, job_id)["replica"]
    kill(APP, lost)
    done = wait_for_state(client, job_id, timeout=WAIT)
    assert done["state"] == "done", done
    assert done["replica"] not in (None, lost) and done["attempts"] == 2
    assert done["results"] == [f"{job_id}-0.png"]
    events = read_events(client, f"/v1/jobs/{job_id}/events", timeout=WAIT)
    kinds = [event["kind"] for event in events]
    assert kinds.count("done") == 1 and kinds[-1] == "done"
    assert [event["replica"] for event in events if event["kind"] == "assigned"][-1] == done["replica"]
    assert any(event["kind"] == "retrying" and event["replica"] == lost for event in events)
    deadline = time.monotonic() + WAIT  # the routes that ask every replica answer without the lost one
    while lost in (queue := client.get("/v1/queue")).json()["replicas"]:
        assert time.monotonic() < deadline, queue.json()
        time.sleep(0.2)
    assert client.get("/v1/manager", params={"format": "text"}).status_code == 200


@pytest.fixture(scope="module")
def small(client) -> Iterator[httpx.Client]:
    """A client of the second app, ``small`` at ``/small`` (deployed with the first): one worker replica, one
    try, a queue of one."""
    with httpx.Client(base_url=f"{base(client)}/small", headers=client.headers, timeout=WAIT) as made:
        yield made


def test_a_replica_with_a_full_queue_still_takes_a_cancel(small):
    job_id = small.post("/v1/jobs", json=request(seed=33, steps=40)).json()["id"]
    running(small, job_id)
    assert small.post("/v1/jobs", json=request(seed=34)).status_code == 429
    assert small.get("/v1/queue").status_code == 200  # every replica answers, its queue full
    assert small.delete(f"/v1/jobs/{job_id}").status_code == 202
    done = wait_for_state(small, job_id, timeout=WAIT)
    assert done["state"] == "cancelled" and done["results"] == [], done


def test_with_one_try_a_replica_killed_mid_job_fails_the_job_naming_it(small):
    job_id = small.post("/v1/jobs", json=request(seed=32, steps=12)).json()["id"]
    lost = running(small, job_id)["replica"]
    kill("small", lost)
    done = wait_for_state(small, job_id, timeout=WAIT)
    assert done["state"] == "failed", done
    assert f"replica {lost} was lost" in done["error"] and done["results"] == []
