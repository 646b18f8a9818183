"""The HTTP app of ``modular serve`` over the ingress (``make_app(RoutedJobs(...))`` over ``LocalWorkers``),
served by uvicorn on a free loopback port as tests/http serve one machine's: the token, body limits, jobs
in and out, results, event streams, and the routes that answer for each replica. No Ray: these run
everywhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import httpx
import pytest

from modular.http import RunningServer, ServerSettings, make_app, start_server
from tests.http.helpers import TOKEN, read_events, streaming, wait_for_state
from tests.http.test_api import input_image

from .conftest import SMALL, WAIT, Routed


class Served(NamedTuple):
    routed: Routed
    server: RunningServer
    client: httpx.Client


def request(workflow: str = "sd", seed: int = 7, **more: Any) -> dict[str, Any]:
    return {**SMALL, "workflow": workflow, "seed": seed, **more}


def error_of(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]


@pytest.fixture
def serve(routed) -> Iterator[Callable[..., Served]]:
    """``serve(settings=None, **routed_options)``: the app over a new ingress (``routed``), started on a free
    loopback port with the token ``TOKEN``; its client sends the token. Stopped at teardown, before the
    ingress closes."""
    started: list[Served] = []

    def make(settings: ServerSettings | None = None, **options: Any) -> Served:
        one = routed(**options)
        settings = settings or ServerSettings(port=0, token=TOKEN)
        server = start_server(make_app(one.jobs, settings), settings)
        client = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=WAIT)
        started.append(Served(one, server, client))
        return started[-1]

    yield make
    for served in reversed(started):
        served.client.close()
        served.server.stop()
        assert not served.server.thread.is_alive(), "the HTTP server's thread is still running"


def test_every_route_but_health_needs_the_token(serve):
    _, server, client = serve()
    with httpx.Client(base_url=server.url, timeout=WAIT) as stranger:
        for method, path in [
            ("GET", "/v1/jobs"),
            ("POST", "/v1/jobs"),
            ("GET", "/v1/queue"),
            ("POST", "/v1/queue/pause"),
            ("GET", "/v1/manager"),
            ("GET", "/v1/events"),
            ("GET", "/"),
        ]:
            response = stranger.request(method, path, json=request() if method == "POST" else None)
            assert response.status_code == 401, (method, path)
            assert response.headers["www-authenticate"] == "Bearer"
            assert error_of(response)["type"] == "Unauthorized"
        wrong = stranger.get("/v1/queue", headers={"Authorization": "Bearer " + "x" * 32})
        assert wrong.status_code == 401
        assert stranger.get("/healthz").json() == {"ok": True}
    assert client.get("/v1/queue").status_code == 200
    assert client.get("/v1/jobs").json() == []  # nothing the strangers sent was taken


def test_a_body_or_an_image_over_its_limit_is_413(serve):
    image = input_image()
    settings = ServerSettings(port=0, token=TOKEN, max_body=4000, max_upload=len(image) - 1)
    one, _, client = serve(settings)
    big = client.post("/v1/jobs", json=request(prompt="x" * 5000))
    assert big.status_code == 413 and "this server takes at most 4000" in error_of(big)["message"]
    upload = client.post(
        "/v1/jobs",
        data={"request": json.dumps(request(inputs={"strength": 0.5}))},
        files={"image": ("a.png", image, "image/png")},
    )
    assert upload.status_code == 413
    assert error_of(upload)["message"] == (
        f"image 'image' is {len(image)} bytes; this server takes at most {len(image) - 1}"
    )
    assert one.jobs.jobs() == [] and list(one.jobs.uploads.glob("*")) == []
    assert all(replica.scheduler.jobs() == [] for replica in one.replicas.values())


def test_a_job_is_202_then_done_and_its_result_is_the_direct_calls_png(serve, direct):
    _, _, client = serve()
    response = client.post("/v1/jobs", json=request(seed=11))
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["state"] == "queued" and body["seeds"] == [11]
    assert response.headers["location"] == f"/v1/jobs/{body['id']}"
    job = wait_for_state(client, body["id"], timeout=WAIT)
    assert job["state"] == "done", job["error"]
    assert job["replica"] in ("r1", "r2") and job["request"]["seed"] == 11
    result = client.get(f"/v1/jobs/{body['id']}/result")
    assert result.status_code == 200 and result.headers["content-type"] == "image/png"
    assert result.content == direct(request(seed=11))[0]
    assert client.get(f"/v1/jobs/{body['id']}/result", params={"index": 1}).status_code == 404
    assert [listed["id"] for listed in client.get("/v1/jobs", params={"state": "done"}).json()] == [
        body["id"]
    ]


def test_bad_requests_get_the_single_machines_answers(serve):
    one, _, client = serve(max_queue=1)
    unknown = client.post("/v1/jobs", json=request("nope"))
    assert unknown.status_code == 400 and error_of(unknown)["type"] == "RequestError"
    assert "nope" in error_of(unknown)["message"]
    bad_input = client.post("/v1/jobs", json=request(inputs={"no_such_input": 1}))
    assert bad_input.status_code == 400 and error_of(bad_input)["type"] == "UnknownInputError"
    assert client.get("/v1/jobs/none").status_code == 404
    assert client.delete("/v1/jobs/none").status_code == 404
    client.post("/v1/queue/pause")
    assert client.post("/v1/jobs", json=request()).status_code == 202
    full = client.post("/v1/jobs", json=request(seed=2))
    assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
    assert error_of(full)["type"] == "QueueFullError"


def test_a_jobs_events_stream_from_its_replica_through_the_ingress(serve):
    one, server, client = serve()
    job_id = client.post("/v1/jobs", json=request(steps=3)).json()["id"]
    events = read_events(client, f"/v1/jobs/{job_id}/events")
    kinds = [event["kind"] for event in events if event["kind"] != "position"]
    assert kinds[:3] == ["queued", "assigned", "started"] and kinds[-1] == "done", kinds
    assert all(event["job"] == job_id for event in events)
    replica = client.get(f"/v1/jobs/{job_id}").json()["replica"]
    assert all(event["replica"] == replica for event in events if event["kind"] != "queued")
    steps = [event for event in events if event["kind"] == "step"]
    assert [event["step"] for event in steps] == sorted(event["step"] for event in steps) and steps
    # the whole queue's stream, listened to before a job comes
    with streaming(server.url, "/v1/events", one.jobs.events, timeout=WAIT, headers=client.headers) as seen:
        second = client.post("/v1/jobs", json=request(seed=3)).json()["id"]
    everything = seen.result(WAIT)
    assert [event["kind"] for event in everything if event["job"] == second][-1] == "done"


def test_cancel_pause_and_resume_over_http(serve):
    one, _, client = serve()
    assert client.post("/v1/queue/pause").json() == {"paused": True}
    queue = client.get("/v1/queue").json()
    assert queue["paused"] is True
    assert all(replica.scheduler.paused for replica in one.replicas.values())
    first = client.post("/v1/jobs", json=request(seed=1)).json()["id"]
    second = client.post("/v1/jobs", json=request(seed=2)).json()["id"]
    assert client.get("/v1/queue").json()["waiting"] == [first, second]
    cancelled = client.delete(f"/v1/jobs/{first}")
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    assert client.delete(f"/v1/jobs/{first}").status_code == 409
    assert client.post("/v1/queue/resume").json() == {"paused": False}
    assert wait_for_state(client, second, timeout=WAIT)["state"] == "done"
    assert client.get(f"/v1/jobs/{first}").json()["state"] == "cancelled"


def test_the_queue_manager_and_memory_answer_for_each_replica(serve):
    _, _, client = serve(hold=("r1", "r2"))
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    job = wait_for_state(client, job_id, ("running",), timeout=WAIT)
    queue = client.get("/v1/queue").json()
    assert queue["running"] == job_id
    assert queue["replicas"] == {name: [job_id] if name == job["replica"] else [] for name in ("r1", "r2")}
    text = client.get("/v1/manager", params={"format": "text"})
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    assert "replica r1\n" in text.text and "replica r2\n" in text.text
    components = client.get("/v1/manager").json()["components"]
    assert {component["replica"] for component in components} == {"r1", "r2"}
    memory = client.get("/v1/memory").json()
    assert set(memory["replicas"]) == {"r1", "r2"}
    assert {device["device"].split("/")[0] for device in memory["devices"]} == {"r1", "r2"}
    assert [workflow["name"] for workflow in client.get("/v1/workflows").json()] == ["sd", "flux"]
