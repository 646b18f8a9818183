"""What the HTTP tests share besides fixtures: reading server-sent events, waiting for a job, holding a job."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from modular.serving.events import FINAL_KINDS, EventHub

__all__ = ["FINAL_KINDS", "FLUX", "SD", "TOKEN", "HoldingHub", "read_events", "streaming", "wait_for_state"]

SD = "tiny-sd"  # the served names of the tiny repos (tests/http/conftest.py)
FLUX = "tiny-flux"
TOKEN = "a-test-token-of-32-characters-xx"


def read_events(
    client: httpx.Client,
    path: str,
    until: frozenset[str] = FINAL_KINDS,
    count: int = 1,
    limit: int = 500,
    **request: Any,
) -> list[dict[str, Any]]:
    """The server-sent events of ``path``, parsed (``id``, ``event`` and the ``data`` JSON, checked to agree),
    until ``count`` of kinds ``until`` came (or ``limit`` events, or the server ends the stream)."""
    events: list[dict[str, Any]] = []
    fields: dict[str, str] = {}
    finals = 0
    with client.stream("GET", path, **request) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith(":"):  # a comment: the opening line or a keepalive
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if not fields:
                continue
            event = json.loads(fields["data"])
            assert fields["event"] == event["kind"] and int(fields["id"]) == event["seq"]
            events.append(event)
            fields = {}
            finals += event["kind"] in until
            if finals >= count or len(events) >= limit:
                break
    return events


@contextlib.contextmanager
def streaming(
    url: str, path: str, hub: EventHub, timeout: float = 60.0, **options: Any
) -> Iterator[concurrent.futures.Future[list[dict[str, Any]]]]:
    """Read ``path``'s events in a thread (``read_events(**options)``, a client of its own); inside, the
    stream is subscribed (``hub`` counts its listener), so every event published after is in the result."""
    before = hub.listener_count()
    with httpx.Client(base_url=url, timeout=timeout) as client:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sse-reader") as pool:
            future = pool.submit(read_events, client, path, **options)
            deadline = time.monotonic() + timeout
            while hub.listener_count() <= before and not future.done():
                assert time.monotonic() < deadline, f"{path} did not subscribe within {timeout} s"
                time.sleep(0.01)
            yield future
            future.result(timeout)


def wait_for_state(
    client: httpx.Client, job_id: str, states: tuple[str, ...] = tuple(FINAL_KINDS), timeout: float = 120.0
) -> dict[str, Any]:
    """``GET /v1/jobs/{id}`` until the job is in one of ``states`` (at most ``timeout`` seconds); its JSON."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} is still {job['state']} after {timeout} s"
        time.sleep(0.02)


class HoldingHub(EventHub):
    """An event hub that holds the worker inside a job's first ``step`` event until ``release`` is set:
    the job is running, between two steps, for as long as the test needs (``held`` is set meanwhile).
    Publishing is synchronous in the worker thread, so holding it here holds the job."""

    def __init__(self, hold_kind: str = "step", timeout: float = 60.0) -> None:
        super().__init__()
        self.hold_kind = hold_kind
        self.timeout = timeout
        self.held = threading.Event()
        self.release = threading.Event()
        self._holding_done = False

    def publish(self, kind: str, job_id: str | None = None, **fields: Any) -> dict[str, Any]:
        event = super().publish(kind, job_id, **fields)
        if kind == self.hold_kind and not self._holding_done:
            self._holding_done = True
            self.held.set()
            self.release.wait(self.timeout)  # bounded: a test that forgets to release still ends
        return event
