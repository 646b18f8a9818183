"""The scheduler under threads: eight submitters at once while the worker runs and a reader watches."""

from __future__ import annotations

import collections
import threading

import pytest

from modular.serving import EventHub

from .conftest import SMALL, WAIT, results

THREADS, EACH = 8, 2


@pytest.mark.slow
def test_eight_threads_submit_at_once_while_the_worker_runs(make_scheduler, direct, sizes):
    scheduler = make_scheduler(
        "sd",
        "flux",
        budget=max(sizes["sd"], sizes["flux"]),
        max_queue=THREADS * EACH,
        events=EventHub(listener_size=100_000),  # every event kept: the test counts them
    )
    started = collections.Counter()
    snapshots: list[list[dict]] = []
    stop_reading = threading.Event()
    barrier = threading.Barrier(THREADS + 1)
    submitted: list[tuple[str, dict]] = []
    errors: list[BaseException] = []

    def submit(number: int) -> None:
        try:
            barrier.wait(WAIT)
            for index in range(EACH):
                request = {**SMALL, "workflow": ("sd", "flux")[(number + index) % 2], "seed": index % 2}
                submitted.append((scheduler.submit(request).id, request))
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            errors.append(error)

    def read() -> None:
        while not stop_reading.wait(0.002):  # a pause between reads: a reader holds the lock while it reads
            snapshots.append(scheduler.jobs())

    with scheduler.events.subscribe() as listener:
        scheduler.start()
        reader = threading.Thread(target=read)
        reader.start()
        submitters = [threading.Thread(target=submit, args=(number,)) for number in range(THREADS)]
        for thread in submitters:
            thread.start()
        barrier.wait(WAIT)
        for thread in submitters:
            thread.join(WAIT)
        assert scheduler.wait_idle(WAIT)
        stop_reading.set()
        reader.join(WAIT)
        events = []
        while (event := listener.get(timeout=0)) is not None:
            events.append(event)
    assert errors == [] and listener.dropped == 0
    assert len(snapshots) > 1
    assert len(submitted) == THREADS * EACH and len({job_id for job_id, _ in submitted}) == THREADS * EACH
    for event in events:
        if event["kind"] == "started":
            started[event["job"]] += 1
    finals = collections.Counter(
        event["job"] for event in events if event["kind"] in ("done", "failed", "cancelled")
    )
    for job_id, _ in submitted:
        described = scheduler.describe(job_id)
        assert (described["state"], described["attempts"], len(described["results"])) == ("done", 1, 1)
        assert started[job_id] == 1 and finals[job_id] == 1  # ran once, finished once
        own = [event["kind"] for event in events if event["job"] == job_id]
        assert own[-1] == "done" and "position" not in own[own.index("started") :]  # no stale position
    for snapshot in snapshots:
        waiting = sorted(job["position"] for job in snapshot if job["state"] == "queued")
        assert waiting == list(range(1, len(waiting) + 1))
        assert [job["position"] for job in snapshot if job["state"] == "running"] in ([], [0])
    references = {}
    for job_id, request in submitted:
        key = (request["workflow"], request["seed"])
        if key not in references:
            references[key] = direct(request)
        assert results(scheduler, job_id) == references[key]
    assert scheduler.events.listener_count() == 0
