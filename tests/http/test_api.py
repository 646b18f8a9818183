"""Every route of the HTTP API over real HTTP (uvicorn on a free loopback port, httpx): jobs in (JSON,
multipart, base64), their states, events, results (the direct call's PNG bytes), cancel, the queue, the
manager, memory, workflows, health and the OpenAPI schema."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np
import PIL.Image
import pytest

from modular.serving import Limits
from tests.http.helpers import FLUX, SD, HoldingHub, read_events, streaming, wait_for_state

PROMPT = "a red fox"


def request(workflow: str = SD, **more: Any) -> dict[str, Any]:
    """A small job: 2 steps, 32x32, seed 7 (``more`` adds or replaces keys)."""
    return {"workflow": workflow, "prompt": PROMPT, "steps": 2, "size": "32x32", "seed": 7, **more}


def png_of(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    PIL.Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def input_image(seed: int = 0) -> bytes:
    """A 32x32 RGB noise image as PNG bytes."""
    return png_of((np.random.default_rng(seed).random((32, 32, 3)) * 255).astype(np.uint8))


def decoded(data: bytes) -> PIL.Image.Image:
    image = PIL.Image.open(io.BytesIO(data))
    image.load()
    return image


# -- submitting ---------------------------------------------------------------------------------------


def test_a_json_job_is_accepted_202_with_its_id_position_and_location(serve):
    scheduler, _, client = serve(start=False)
    first = client.post("/v1/jobs", json=request())
    second = client.post("/v1/jobs", json=request(seed=3))  # the same workflow: queued behind the first
    assert first.status_code == second.status_code == 202
    body = second.json()
    assert body["state"] == "queued" and body["seeds"] == [3]
    assert [first.json()["position"], body["position"]] == [1, 2]
    assert second.headers["location"] == f"/v1/jobs/{body['id']}"
    assert first.json()["id"] != body["id"]
    job = client.get(second.headers["location"]).json()
    assert job["id"] == body["id"] and job["workflow"] == SD and job["position"] == 2
    assert job["request"] == request(seed=3)
    assert [waiting.id for waiting in scheduler.waiting()] == [first.json()["id"], body["id"]]


@pytest.mark.parametrize(
    ("workflow", "size", "width", "height"), [(SD, "40x32", 40, 32), (FLUX, "32x32", 32, 32)]
)
def test_the_result_is_the_png_of_the_direct_call(served_server, direct, workflow, size, width, height):
    """The PNG read back is byte for byte the direct ``call_job`` of the same inputs and seed."""
    _, _, client = served_server
    job_id = client.post("/v1/jobs", json=request(workflow, size=size)).json()["id"]
    job = wait_for_state(client, job_id)
    assert job["state"] == "done", job["error"]
    response = client.get(f"/v1/jobs/{job_id}/result")
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    assert decoded(response.content).size == (width, height)
    expected = direct(workflow, 7, prompt=PROMPT, num_inference_steps=2, width=width, height=height)
    assert response.content == expected


def test_several_images_are_read_by_index_each_with_its_seed(served_server, direct):
    """``images_per_prompt`` 2 with seed 7: images 0 and 1 are the direct calls of seeds 7 and 8."""
    _, _, client = served_server
    accepted = client.post("/v1/jobs", json=request(images_per_prompt=2)).json()
    assert accepted["seeds"] == [7, 8]
    assert wait_for_state(client, accepted["id"])["state"] == "done"
    for index, seed in enumerate((7, 8)):
        got = client.get(f"/v1/jobs/{accepted['id']}/result", params={"index": index}).content
        assert got == direct(SD, seed, prompt=PROMPT, num_inference_steps=2, width=32, height=32)
    missing = client.get(f"/v1/jobs/{accepted['id']}/result", params={"index": 2})
    assert missing.status_code == 404
    assert "made 2 images; index 2 is not one" in missing.json()["error"]["message"]


def test_a_result_before_the_job_is_done_is_409(serve):
    _, _, client = serve(start=False)
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    response = client.get(f"/v1/jobs/{job_id}/result")
    assert response.status_code == 409
    assert response.json()["error"] == {
        "type": "JobStateError",
        "message": f"job {job_id!r} is queued; image 0 is not made",
    }
    assert client.get("/v1/jobs/no-such-job/result").status_code == 404


def test_an_image_input_as_a_multipart_file_and_as_base64_make_the_direct_calls_image(served_server, direct):
    """An image-to-image job: the image as a form file, then the same as base64 in ``images``; both are
    the direct call's output for that image."""
    _, _, client = served_server
    image = input_image()
    job = request(inputs={"strength": 0.6})
    as_file = client.post(
        "/v1/jobs",
        data={"request": json.dumps(job)},
        files={"image": ("photo.png", image, "image/png")},
    )
    as_text = client.post("/v1/jobs", json={**job, "images": {"image": base64.b64encode(image).decode()}})
    assert as_file.status_code == as_text.status_code == 202, (as_file.json(), as_text.json())
    expected = direct(
        SD,
        7,
        prompt=PROMPT,
        num_inference_steps=2,
        width=32,
        height=32,
        image=decoded(image).convert("RGB"),
        strength=0.6,
    )
    text_to_image = direct(SD, 7, prompt=PROMPT, num_inference_steps=2, width=32, height=32)
    assert expected != text_to_image  # the image is used
    for accepted in (as_file, as_text):
        assert wait_for_state(client, accepted.json()["id"])["state"] == "done"
        assert client.get(f"/v1/jobs/{accepted.json()['id']}/result").content == expected


# -- looking ------------------------------------------------------------------------------------------


def test_jobs_are_listed_in_arrival_order_and_by_state(serve):
    scheduler, _, client = serve(start=False)
    ids = [client.post("/v1/jobs", json=request(seed=seed)).json()["id"] for seed in (1, 2, 3)]
    assert client.delete(f"/v1/jobs/{ids[1]}").status_code == 202
    listed = client.get("/v1/jobs").json()
    assert [job["id"] for job in listed] == ids
    assert [job["state"] for job in listed] == ["queued", "cancelled", "queued"]
    assert [job["id"] for job in client.get("/v1/jobs", params={"state": "queued"}).json()] == [
        ids[0],
        ids[2],
    ]
    assert [job["id"] for job in client.get("/v1/jobs", params={"state": "cancelled"}).json()] == [ids[1]]
    both = client.get("/v1/jobs", params={"state": "cancelled,queued"}).json()
    assert [job["id"] for job in both] == ids
    assert client.get("/v1/jobs", params={"state": "done"}).json() == []
    refused = client.get("/v1/jobs", params={"state": "queued,finished"})
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "type": "RequestError",
        "message": "state 'finished' is not one of queued, running, done, failed, cancelled",
    }
    assert [job["position"] for job in listed] == [1, None, 2]


def test_a_done_job_has_its_timings_and_no_error(served_server):
    _, _, client = served_server
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    job = wait_for_state(client, job_id)
    assert job["state"] == "done" and job["error"] is None and job["position"] is None
    assert job["created"] <= job["started"] <= job["finished"]
    assert job["waited"] == pytest.approx(job["started"] - job["created"], abs=1e-5)
    assert job["ran"] == pytest.approx(job["finished"] - job["started"], abs=1e-5)
    assert job["results"] == [f"{job_id}-0.png"] and job["attempts"] == 1
    assert job["progress"]["step"] == job["progress"]["total"] >= 2  # the last step (PNDM adds one)


def test_a_failed_job_says_why_and_the_queue_goes_on(serve):
    """A job past its ``timeout`` fails with the reason (held inside its first block until its timer has
    cancelled it, if the timer did not fire before that block); the next job runs."""
    hub = HoldingHub(hold_kind="block")
    scheduler, _, client = serve(events=hub)
    slow = client.post("/v1/jobs", json=request(timeout=0.05)).json()["id"]
    token = scheduler.job(slow).token
    for _ in range(6000):  # bounded: the timer cancels the token after 0.05 s of running
        if token.cancelled:
            break
        hub.release.wait(0.01)
    hub.release.set()
    job = wait_for_state(client, slow)
    assert job["state"] == "failed" and job["error"] == "timed out after 0.05 s"
    assert job["results"] == [] and job["finished"] is not None
    after = client.post("/v1/jobs", json=request()).json()["id"]
    assert wait_for_state(client, after)["state"] == "done"


def test_an_unknown_job_is_404_json(served_server):
    _, _, client = served_server
    response = client.get("/v1/jobs/0123456789abcdef")
    assert response.status_code == 404
    assert response.json() == {
        "error": {"type": "UnknownJobError", "message": "no job has id '0123456789abcdef'"}
    }


# -- events -------------------------------------------------------------------------------------------


def test_a_jobs_events_go_from_queued_to_done_with_steps_and_previews(serve):
    scheduler, server, client = serve(start=False)
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    with streaming(server.url, f"/v1/jobs/{job_id}/events", scheduler.events) as future:
        scheduler.start()
    events = future.result()
    kinds = [event["kind"] for event in events]
    assert kinds[0] == "queued" and kinds[-1] == "done"
    assert kinds.index("started") < kinds.index("block") < kinds.index("step")
    assert all(event["job"] == job_id for event in events)
    steps = [event for event in events if event["kind"] == "step"]
    (total,) = {event["total"] for event in steps}
    assert total >= 2 and [event["step"] for event in steps] == list(range(1, total + 1))
    previews = [event for event in events if event["kind"] == "preview"]
    assert [preview["step"] for preview in previews] == list(range(1, total + 1))  # preview_every=1
    for preview in previews:
        image = decoded(base64.b64decode(preview["png"]))
        assert image.format == "PNG" and image.width > 0 and image.height > 0
    assert events[-1]["results"] == [f"{job_id}-0.png"]
    assert [event["seq"] for event in events] == sorted(event["seq"] for event in events)


def test_a_finished_jobs_events_replay_and_end(served_server):
    """A stream opened after the job finished gives its history (the latest step) and ends at ``done``."""
    _, _, client = served_server
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    wait_for_state(client, job_id)
    kinds = [event["kind"] for event in read_events(client, f"/v1/jobs/{job_id}/events", count=99)]
    assert kinds[0] == "queued" and kinds[-1] == "done" and kinds.count("step") == 1
    assert client.get("/v1/jobs/nope/events").status_code == 404


def test_the_queues_events_carry_every_job_and_the_queues_own(serve):
    scheduler, server, client = serve(start=False)
    with streaming(server.url, "/v1/events", scheduler.events, until=frozenset({"done"}), count=2) as future:
        client.post("/v1/queue/pause")
        first = client.post("/v1/jobs", json=request()).json()["id"]
        second = client.post("/v1/jobs", json=request(FLUX)).json()["id"]
        scheduler.start()
        client.post("/v1/queue/resume")
    events = future.result()
    kinds = [event["kind"] for event in events]
    assert kinds[0] == "paused" and events[0]["job"] is None and "resumed" in kinds
    done = [event["job"] for event in events if event["kind"] == "done"]
    assert sorted(done) == sorted([first, second])
    for job_id in (first, second):
        own = [event["kind"] for event in events if event["job"] == job_id]
        assert own[0] == "queued" and own[-1] == "done" and "step" in own


# -- cancel -------------------------------------------------------------------------------------------


def test_cancelling_a_waiting_job(serve):
    scheduler, _, client = serve(start=False)
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    response = client.delete(f"/v1/jobs/{job_id}")
    assert response.status_code == 202 and response.json()["state"] == "cancelled"
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "cancelled" and job["started"] is None and job["error"] == "cancelled by a client"
    assert scheduler.waiting() == [] and scheduler.run_next() is None  # nothing left to run
    assert [event["kind"] for event in read_events(client, f"/v1/jobs/{job_id}/events")][-1] == "cancelled"


def test_cancelling_the_running_job_stops_it_between_steps(serve):
    """The job is held inside its first step (the worker publishing it); the cancel lands there, and the
    job stops before its next step without a result. The next job runs."""
    hub = HoldingHub()
    scheduler, _, client = serve(events=hub)
    job_id = client.post("/v1/jobs", json=request(steps=3)).json()["id"]
    assert hub.held.wait(60)
    assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "running"
    response = client.delete(f"/v1/jobs/{job_id}")
    assert (
        response.status_code == 202 and response.json()["state"] == "running"
    )  # asked; stops at its next check
    hub.release.set()
    job = wait_for_state(client, job_id)
    assert job["state"] == "cancelled" and job["results"] == [] and job["progress"]["step"] == 1
    assert client.get(f"/v1/jobs/{job_id}/result").status_code == 409
    after = client.post("/v1/jobs", json=request()).json()["id"]
    assert wait_for_state(client, after)["state"] == "done"


def test_cancelling_a_done_job_is_409_and_an_unknown_one_404(served_server):
    _, _, client = served_server
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    wait_for_state(client, job_id)
    done = client.delete(f"/v1/jobs/{job_id}")
    assert done.status_code == 409
    assert done.json()["error"] == {
        "type": "JobStateError",
        "message": f"job {job_id!r} is done; there is nothing to cancel",
    }
    assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "done"
    assert client.delete("/v1/jobs/no-such-job").status_code == 404


# -- the queue ----------------------------------------------------------------------------------------


def test_pause_holds_the_queue_and_resume_runs_it(served_server):
    scheduler, _, client = served_server
    assert client.post("/v1/queue/pause").json() == {"paused": True}
    ids = [client.post("/v1/jobs", json=request(seed=seed)).json()["id"] for seed in (1, 2)]
    queue = client.get("/v1/queue").json()
    assert queue == {"paused": True, "waiting": ids, "running": None, "max_queue": 100}
    assert scheduler.run_next() is None  # paused: no job may start
    assert [client.get(f"/v1/jobs/{job_id}").json()["state"] for job_id in ids] == ["queued", "queued"]
    assert client.post("/v1/queue/resume").json() == {"paused": False}
    assert [wait_for_state(client, job_id)["state"] for job_id in ids] == ["done", "done"]
    assert client.get("/v1/queue").json()["waiting"] == []


# -- the manager, memory, workflows -------------------------------------------------------------------


def test_the_manager_as_json_and_as_its_printed_table(served_server):
    scheduler, _, client = served_server
    wait_for_state(client, client.post("/v1/jobs", json=request()).json()["id"])
    manager = scheduler.manager
    table = client.get("/v1/manager", params={"format": "text"})
    assert table.status_code == 200 and table.headers["content-type"].startswith("text/plain")
    assert table.text == str(manager)
    components = client.get("/v1/manager").json()["components"]
    assert [component["id"] for component in components] == list(manager.components)
    unet = next(component for component in components if component["id"].startswith("unet_"))
    assert unet["class_name"] == "UNet2DConditionModel"
    assert client.get("/v1/manager", params={"format": "xml"}).status_code == 400


def test_memory_under_simulated_offload_is_the_offload_logs_samples(serve):
    budget = 64 * 1024**2
    scheduler, _, client = serve(sim_budget=budget)
    wait_for_state(client, client.post("/v1/jobs", json=request()).json()["id"])
    report = client.get("/v1/memory").json()
    (engine,) = scheduler.manager.offload_engines
    (device,) = report["devices"]
    assert device["total"] == budget
    log = list(engine.log)
    assert log and [sample["model"] for sample in device["samples"]] == [
        decision.model_id for decision in log
    ]
    assert [sample["used"] for sample in device["samples"]] == [
        budget - decision.free_after for decision in log
    ]
    assert set(device["resident"]) == set(engine.resident_ids())
    assert report["host"]["rss"] > 0


def test_memory_without_offload_has_the_host_only(served_server):
    _, _, client = served_server
    report = client.get("/v1/memory").json()
    assert report["devices"] == [] and report["host"]["rss"] > 0 and report["host"]["host_copies"] == 0


def test_the_workflows_with_their_inputs_types_and_defaults(served_server, tiny_repos):
    _, _, client = served_server
    workflows = {workflow["name"]: workflow for workflow in client.get("/v1/workflows").json()}
    assert list(workflows) == [SD, FLUX]
    assert workflows[SD]["repo"] == str(tiny_repos.sd) and "workflow" not in workflows[SD]
    assert workflows[FLUX]["workflow"] == "text2image"
    assert workflows[SD]["family"] == "StableDiffusionAutoBlocks"
    inputs = {item["name"]: item for item in workflows[SD]["inputs"]}
    assert inputs["num_inference_steps"]["type"] == "int" and inputs["num_inference_steps"]["default"] == 50
    assert inputs["prompt"]["type"].startswith("str") and inputs["prompt"]["required"] is False
    assert "image" in inputs and "strength" in inputs  # the whole SD pipeline takes an image
    flux_inputs = {item["name"] for item in workflows[FLUX]["inputs"]}
    assert "prompt" in flux_inputs and "image" not in flux_inputs  # pruned to text-to-image


# -- health and schema --------------------------------------------------------------------------------


def test_health_and_the_openapi_schema(served_server):
    _, _, client = served_server
    assert client.get("/healthz").json() == {"ok": True}
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    routes = {
        "/v1/jobs": {"get", "post"},
        "/v1/jobs/{job_id}": {"get", "delete"},
        "/v1/jobs/{job_id}/events": {"get"},
        "/v1/jobs/{job_id}/result": {"get"},
        "/v1/events": {"get"},
        "/v1/manager": {"get"},
        "/v1/memory": {"get"},
        "/v1/workflows": {"get"},
        "/v1/queue": {"get"},
        "/v1/queue/pause": {"post"},
        "/v1/queue/resume": {"post"},
        "/healthz": {"get"},
    }
    for path, methods in routes.items():
        assert methods <= set(paths[path]), path
    body = paths["/v1/jobs"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(body)
    assert "prompt" in body["application/json"]["schema"]["properties"]


def test_limits_given_to_the_scheduler_are_the_servers(serve):
    """The factory passes limits through: a request within them is accepted, one past them refused."""
    _, _, client = serve(limits=Limits(max_steps=3), start=False)
    assert client.post("/v1/jobs", json=request(steps=3)).status_code == 202
    assert client.post("/v1/jobs", json=request(steps=4)).status_code == 400


def test_stopping_the_server_ends_open_event_streams_cleanly(serve):
    """A page left open does not hold the shutdown: its streams end (a complete response, no dropped
    connection) and the server's thread stops."""
    scheduler, server, client = serve(start=False)
    job_id = client.post("/v1/jobs", json=request()).json()["id"]
    with streaming(server.url, "/v1/events", scheduler.events, limit=10**6) as queue_stream:
        with streaming(server.url, f"/v1/jobs/{job_id}/events", scheduler.events) as job_stream:
            server.stop()
    assert not server.thread.is_alive()
    assert queue_stream.result() == []  # ended by the server, without an error
    assert [event["kind"] for event in job_stream.result()] == ["queued", "position"]
