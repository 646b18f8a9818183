"""Load and faults over HTTP: a real server on a free loopback port, many clients at once, and every
kind of bad request among the good ones.

``LOAD_REQUESTS`` client actions (each one ``POST /v1/jobs``, some followed by a cancel or an event stream
the client drops) from ``CLIENTS`` threads over tiny SD and Flux repos. The count is kept small for CI; run
more by hand with ``MODULAR_LOAD_REQUESTS=2000 python -m pytest tests/http/test_load.py`` (the memory check
then reads the last 100 of them).
"""

from __future__ import annotations

import base64
import gc
import io
import json
import os
import random
import threading
import time

import numpy as np
import PIL.Image
import pytest

from modular.http.memory import rss_bytes
from tests.http.load_helpers import FINAL, FLUX, SD, DirectCalls, make_repos, open_fds, serving

# At least the 200. The first LOAD_REQUESTS - WINDOW actions are the warm-up: measured by hand, RSS
# rises by about a tenth over the first 200 (pipelines loaded, each thread's allocator arena grown) and then
# stays within 1 % up to 600 and beyond; memory is checked over the last WINDOW.
LOAD_REQUESTS = int(os.environ.get("MODULAR_LOAD_REQUESTS", "300"))
CLIENTS = 8
WINDOW = 100
MAX_BODY = 64 * 1024
MAX_UPLOAD = 4 * 1024
PROMPTS = ("a red fox", "a lighthouse at dusk", "three pears")
SEEDS = (0, 1, 2, 3)
KINDS = {  # what a client does, and how often
    "job": 40,
    "cancel": 15,
    "drop_stream": 10,
    "malformed": 8,
    "oversized_body": 5,
    "oversized_upload": 5,
    "oversized_form": 4,
    "unknown_workflow": 5,
    "unknown_input": 5,
    "over_limit": 3,
}
pytestmark = pytest.mark.slow


def _noise_png(side: int, seed: int) -> bytes:
    """A PNG of random pixels: it does not compress, so its bytes pass ``MAX_UPLOAD``."""
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    PIL.Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


class Client(threading.Thread):
    """One client: its share of the actions, each recorded as (kind, status, answer)."""

    def __init__(self, number: int, served, actions: list[str], counter, samples) -> None:
        super().__init__(name=f"load-client-{number}")
        self.served = served
        self.actions = actions
        self.rng = random.Random(number)
        self.counter = counter
        self.samples = samples
        self.accepted: dict[str, dict] = {}  # job id -> its request
        self.refusals: list[tuple[str, int, dict]] = []
        self.problems: list[str] = []

    def good_request(self) -> dict:
        return {
            "workflow": self.rng.choice((SD, FLUX)),
            "prompt": self.rng.choice(PROMPTS),
            "seed": self.rng.choice(SEEDS),
            "steps": 1,
            "size": "32x32",
        }

    def run(self) -> None:
        with self.served.client() as http:
            for kind in self.actions:
                try:
                    getattr(self, kind)(http)
                except Exception as error:  # recorded: the test names every client's problem at once
                    self.problems.append(f"{kind}: {type(error).__name__}: {error}")
                self.counter.tick(self.samples)

    def _submit(self, http, request: dict) -> str | None:
        answer = http.post("/v1/jobs", json=request)
        if answer.status_code == 429:  # a full queue refuses, and says when to come back
            assert "retry-after" in answer.headers
            return None
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        self.accepted[job_id] = request
        return job_id

    def refused(self, kind: str, answer, *statuses: int) -> None:
        body = answer.json()
        if answer.status_code not in statuses or set(body) != {"error"} or "Traceback" in answer.text:
            self.problems.append(f"{kind}: {answer.status_code} {answer.text[:300]}")
        self.refusals.append((kind, answer.status_code, body))

    # -- the actions --------------------------------------------------------------------------------
    def job(self, http) -> None:
        self._submit(http, self.good_request())

    def cancel(self, http) -> None:
        job_id = self._submit(http, self.good_request())
        if job_id is None:
            return
        time.sleep(self.rng.uniform(0, 0.05))
        answer = http.delete(f"/v1/jobs/{job_id}")
        # 202: cancelled (or cancelling, when it runs); 409: it finished first
        assert answer.status_code in (202, 409), answer.text

    def drop_stream(self, http) -> None:
        job_id = self._submit(http, self.good_request())
        if job_id is None:
            return
        path = self.rng.choice((f"/v1/jobs/{job_id}/events", "/v1/events"))  # one job's, or the queue's
        with http.stream("GET", path) as stream:
            assert stream.status_code == 200
            for number, _line in enumerate(stream.iter_lines()):
                if number >= self.rng.randrange(1, 6):
                    break  # the client leaves mid-stream

    def malformed(self, http) -> None:
        body = self.rng.choice((b"{bad", b'{"prompt": "a fox",}', b"\xff\xfe", b"[1, 2", b""))
        answer = http.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
        self.refused("malformed", answer, 400)

    def oversized_body(self, http) -> None:
        request = {**self.good_request(), "prompt": "x" * (MAX_BODY + 1)}
        self.refused("oversized_body", http.post("/v1/jobs", json=request), 413)

    def oversized_upload(self, http) -> None:
        image = base64.b64encode(_noise_png(48, self.rng.randrange(1000))).decode()
        request = {**self.good_request(), "workflow": SD, "images": {"image": image}}
        self.refused("oversized_upload", http.post("/v1/jobs", json=request), 413)

    def oversized_form(self, http) -> None:
        request = {**self.good_request(), "workflow": SD}
        files = {"image": ("fox.png", _noise_png(48, self.rng.randrange(1000)), "image/png")}
        answer = http.post("/v1/jobs", data={"request": json.dumps(request)}, files=files)
        self.refused("oversized_form", answer, 413)

    def unknown_workflow(self, http) -> None:
        request = {
            **self.good_request(),
            "workflow": self.rng.choice(("tiny-sdxl", "../tiny-sd", "org/model")),
        }
        self.refused("unknown_workflow", http.post("/v1/jobs", json=request), 400)

    def unknown_input(self, http) -> None:
        request = {**self.good_request(), "inputs": {"num_inference_stepz": 2}}
        self.refused("unknown_input", http.post("/v1/jobs", json=request), 400)

    def over_limit(self, http) -> None:
        request = {**self.good_request(), "steps": 50}
        self.refused("over_limit", http.post("/v1/jobs", json=request), 400)


class Counter:
    """Actions done so far, and this process's RSS after each of the last ``WINDOW``."""

    def __init__(self) -> None:
        self.done = 0
        self.lock = threading.Lock()

    def tick(self, samples: list[tuple[int, int]]) -> None:
        with self.lock:
            self.done += 1
            if self.done >= LOAD_REQUESTS - WINDOW:
                samples.append((self.done, rss_bytes()))


def _wait_final(http, job_ids, timeout: float = 120.0) -> dict[str, dict]:
    """Each job as the server describes it once it has ended (polled, within ``timeout`` seconds)."""
    described: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    for job_id in job_ids:
        while True:
            job = http.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in FINAL or time.monotonic() > deadline:
                described[job_id] = job
                break
            time.sleep(0.05)
    return described


def _wait_for(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return make_repos(tmp_path_factory.mktemp("repos"))


def test_many_clients_with_faults_leave_every_job_ended_and_equal_to_the_direct_call(repos, tmp_path):
    """LOAD_REQUESTS actions from 8 threads (good jobs, cancels, dropped event streams, malformed JSON,
    oversized bodies and uploads, unknown workflows and inputs, asks past the limits): every accepted job
    ends done, failed or cancelled; every done image equals the direct call's PNG byte for byte; every
    refusal is a JSON error with its status; the hub holds no listener of a dropped stream; memory stays
    within 5 % over the last WINDOW actions; no thread or file descriptor is left after the server stops."""
    direct = DirectCalls(repos)
    direct.load()  # the libraries' first-use threads and files come before the baseline
    threads_before, fds_before = threading.active_count(), open_fds()
    rng = random.Random(24)
    actions = rng.choices(list(KINDS), weights=list(KINDS.values()), k=LOAD_REQUESTS)
    for kind in KINDS:  # each kind at least once, whatever the draw
        if kind not in actions:
            actions[rng.randrange(len(actions))] = kind
    counter, samples = Counter(), []
    with serving(repos, tmp_path / "state", max_body=MAX_BODY, max_upload=MAX_UPLOAD) as served:
        clients = [
            Client(number, served, actions[number::CLIENTS], counter, samples) for number in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(300)
        assert not any(client.is_alive() for client in clients), "a client did not finish"
        assert served.scheduler.wait_idle(120)
        gc.collect()
        settled = rss_bytes()  # idle: no request or job in flight
        accepted = {job_id: request for client in clients for job_id, request in client.accepted.items()}
        with served.client() as http:
            described = _wait_final(http, accepted)
            pngs = {
                job_id: http.get(f"/v1/jobs/{job_id}/result").content
                for job_id, job in described.items()
                if job["state"] == "done"
            }
        listeners_left = _wait_for(lambda: served.scheduler.events.listener_count() == 0)
        listener_count = served.scheduler.events.listener_count()
    assert [problem for client in clients for problem in client.problems] == []
    assert listeners_left, f"{listener_count} listeners of dropped streams are still subscribed"

    states = {job_id: job["state"] for job_id, job in described.items()}
    assert {state for state in states.values()} <= set(FINAL), states
    failed = {job_id: job["error"] for job_id, job in described.items() if job["state"] == "failed"}
    assert failed == {}  # every accepted request was valid: none may fail
    assert "done" in states.values() and "cancelled" in states.values()
    unequal = [
        job_id
        for job_id, png in pngs.items()
        if png
        != direct.png(accepted[job_id]["workflow"], accepted[job_id]["prompt"], accepted[job_id]["seed"])
    ]
    assert unequal == [], f"{len(unequal)} of {len(pngs)} results differ from the direct call"
    refused_kinds = {kind for client in clients for kind, _status, _body in client.refusals}
    assert refused_kinds == set(KINDS) - {"job", "cancel", "drop_stream"}

    # Growth is the idle RSS at the end against the RSS as the window began. While requests and jobs are in
    # flight RSS swings by a few percent and comes back (bodies, decoded images, a call's activations), so
    # the peak is only bounded loosely: a leak shows in the settled figure.
    start_rss = samples[0][1]
    peak = max(rss for _done, rss in samples)
    assert settled <= start_rss * 1.05, (
        f"RSS grew from {start_rss / 2**20:.1f} MiB to {settled / 2**20:.1f} MiB over the last {WINDOW} actions"
    )
    assert peak <= start_rss * 1.10, f"RSS peaked at {peak / 2**20:.1f} MiB from {start_rss / 2**20:.1f} MiB"
    assert _wait_for(lambda: threading.active_count() <= threads_before), [
        thread.name for thread in threading.enumerate()
    ]
    assert _wait_for(lambda: open_fds() <= fds_before), f"{open_fds()} fds open, {fds_before} before"
