"""The Ray Serve replica's class called directly, without Ray (these run everywhere)."""

from __future__ import annotations

import asyncio

import pytest

from modular.ray_serve.worker import ReplicaWorker, job_replica, needs_table
from modular.serving import ResidencyReport, UnknownJobError

from .conftest import SMALL, finished


@pytest.fixture
def worker(workflows, sizes):
    made = ReplicaWorker(
        [workflows["sd"], workflows["flux"]], budget=max(sizes.values()), replica_id="r1", preview_every=None
    )
    yield made
    made.close()


def test_a_job_through_the_replica_equals_the_direct_call(worker, direct):
    request = {**SMALL, "workflow": "sd", "seed": 3}
    job = worker.submit(request)
    assert job["replica"] == "r1" and job_replica(job["id"]) == "r1"
    done = finished(worker.describe, job["id"])
    assert done["state"] == "done", done["error"]
    assert done["id"] == job["id"] and done["replica"] == "r1"
    assert worker.result(job["id"], 0) == direct(request)[0]
    with pytest.raises(LookupError, match="has 1 image"):
        worker.result(job["id"], 1)


def test_the_routing_stats_name_what_the_job_loaded(worker):
    before = worker.record_routing_stats()
    assert before == {
        "missing": {},
        "queued": 0,
        "unloadable": [],
        "seconds": {},
        "streamed": {},
        "seconds_per_byte": 0.0,
        "replica": "r1",
    }
    job = worker.submit({**SMALL, "workflow": "sd", "seed": 1})
    assert finished(worker.describe, job["id"])["state"] == "done"
    stats = worker.record_routing_stats()
    report = ResidencyReport.from_dict(stats)
    needs = needs_table(worker.served)
    assert set(report.missing) == set(needs["sd"])  # the sd models, each by its load ID
    assert report.bytes_for(needs["sd"]) == 0  # all on the (simulated) device: nothing to move
    assert report.bytes_for(needs["flux"]) == sum(needs["flux"].values())
    assert stats["replica"] == "r1" and report.queued == 0
    assert set(report.seconds) == {"sd"} and report.seconds["sd"] > 0  # the done job's seconds


def test_the_report_counts_each_callers_streams_while_they_are_open(worker):
    async def follow():
        worker.scheduler.pause()  # the job waits: its stream stays open
        stream = worker.run({**SMALL, "workflow": "sd", "seed": 4}, caller="host:7")
        assigned = await stream.__anext__()
        plain = worker.submit({**SMALL, "workflow": "sd", "seed": 5})  # no caller: counted in queued only
        report = ResidencyReport.from_dict(worker.record_routing_stats())
        await stream.aclose()  # the ingress stopped listening: the job is cancelled, the count gone
        worker.cancel(plain["id"])
        return assigned, report, ResidencyReport.from_dict(worker.record_routing_stats())

    assigned, open_report, closed_report = asyncio.run(follow())
    assert assigned["kind"] == "assigned"
    assert (open_report.queued, dict(open_report.streamed)) == (2, {"host:7": 1})
    assert (closed_report.queued, dict(closed_report.streamed)) == (0, {})


def test_moved_bytes_counts_what_a_job_brought_to_the_device(worker, sizes):
    assert worker.moved_bytes() == {"bytes_to_device": 0, "replica": "r1"}
    job = worker.submit({**SMALL, "workflow": "sd", "seed": 2})
    assert finished(worker.describe, job["id"])["state"] == "done"
    moved = worker.moved_bytes()["bytes_to_device"]
    assert moved == worker.manager.offload_log.total_bytes_to_device
    assert moved == sizes["sd"]  # every sd model, whole, onto the empty device (it holds them all)
    job = worker.submit({**SMALL, "workflow": "sd", "seed": 3})
    assert finished(worker.describe, job["id"])["state"] == "done"
    assert worker.moved_bytes()["bytes_to_device"] == moved  # all resident already: nothing more to move


def test_moved_bytes_is_zero_with_offload_off(workflows):
    worker = ReplicaWorker([workflows["sd"]], replica_id="r4", preview_every=None)
    try:
        job = worker.submit({**SMALL, "workflow": "sd", "seed": 0})
        assert finished(worker.describe, job["id"])["state"] == "done"
        assert worker.moved_bytes() == {"bytes_to_device": 0, "replica": "r4"}
    finally:
        worker.close()


def test_another_replicas_job_is_unknown_here(worker):
    for job_id in ("r2:abc", "abc", "r1:missing"):
        with pytest.raises(UnknownJobError):
            worker.describe(job_id)
    with pytest.raises(UnknownJobError):
        worker.cancel("r2:abc")


def test_a_cancelled_job_is_described_cancelled(workflows):
    worker = ReplicaWorker([workflows["sd"]], replica_id="r3", preview_every=None)
    try:
        worker.scheduler.pause()  # nothing starts: the job waits
        job = worker.submit({**SMALL, "workflow": "sd", "seed": 0})
        assert worker.cancel(job["id"])["state"] == "cancelled"
    finally:
        worker.close()
    worker.close()  # a second close does nothing


def test_job_replica_reads_the_replica_of_an_id():
    assert job_replica("abc:0123") == "abc"
    assert [job_replica(value) for value in ("0123", ":0123", "abc:", None, 5)] == [None] * 5


def test_a_bandwidth_makes_the_replicas_moves_take_real_time(workflows, sizes):
    worker = ReplicaWorker(
        [workflows["sd"]], sizes["sd"], bandwidth="1GB/s", replica_id="r5", preview_every=None
    )
    try:
        (engine,) = worker.manager.offload_engines
        device = engine._placer._probe
        assert device.real_time and device.h2d_bandwidth == 10**9
    finally:
        worker.close()


@pytest.mark.parametrize(
    ("budget", "bandwidth", "match"), [(None, "1GB/s", "give a budget"), (10**6, "fast", "h2d_bandwidth")]
)
def test_a_bandwidth_without_a_budget_or_unreadable_is_refused(workflows, budget, bandwidth, match):
    with pytest.raises(ValueError, match=match):
        ReplicaWorker([workflows["sd"]], budget, bandwidth=bandwidth, replica_id="r6", preview_every=None)


def test_a_preloaded_replica_holds_every_workflow_on_the_host_before_its_first_job(workflows, sizes):
    worker = ReplicaWorker(
        [workflows["sd"], workflows["flux"]],
        max(sizes.values()),
        preload=True,
        replica_id="r7",
        preview_every=None,
    )
    try:
        report = ResidencyReport.from_dict(worker.record_routing_stats())
        needs = needs_table(worker.served)
        for workflow in ("sd", "flux"):  # held, none on the device: each would move its whole size
            assert set(needs[workflow]) <= set(report.missing)
            assert report.bytes_for(needs[workflow]) == sum(needs[workflow].values())
        assert worker.moved_bytes()["bytes_to_device"] == 0 and report.unloadable == ()
    finally:
        worker.close()


def test_a_preload_that_fails_leaves_no_scheduler_running(workflows, monkeypatch):
    from modular.serving import Scheduler

    closed, close = [], Scheduler.close

    def unreadable(self):
        raise OSError("unreadable")

    def recorded_close(self):
        closed.append(self)
        close(self)

    monkeypatch.setattr(Scheduler, "preload", unreadable)
    monkeypatch.setattr(Scheduler, "close", recorded_close)
    with pytest.raises(OSError, match="unreadable"):
        ReplicaWorker([workflows["sd"]], 10**8, preload=True, replica_id="r8", preview_every=None)
    assert len(closed) == 1 and closed[0]._worker is None  # closed before it was started


def test_a_replica_id_with_the_separator_is_refused(workflows):
    with pytest.raises(ValueError, match="may not hold"):
        ReplicaWorker([workflows["sd"]], replica_id="a:b")
