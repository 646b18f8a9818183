"""Cancel (waiting, running, while loading), pause and resume, a per-job timeout, and a stop mid-call."""

from __future__ import annotations

import threading

import pytest

from modular.serving import EventHub, JobStateError, UnknownJobError

from .conftest import SMALL, WAIT, drain, requests_of, results


def _final(scheduler, job_id):
    return scheduler.describe(job_id)["state"]


# -- cancel ----------------------------------------------------------------------------------------------
def test_cancel_a_waiting_job(make_scheduler, direct):
    scheduler = make_scheduler("sd")
    requests = requests_of(["sd", "sd", "sd"])
    ids = [scheduler.submit(request).id for request in requests]
    with scheduler.events.subscribe(ids[1]) as listener:
        cancelled = scheduler.cancel(ids[1], "changed my mind")
        assert cancelled.state == "cancelled" and cancelled.error == "changed my mind"
        kinds = []
        while (event := listener.get(timeout=0)) is not None:
            kinds.append(event)
    assert [event["kind"] for event in kinds][-1] == "cancelled"
    assert kinds[-1]["error"] == "changed my mind"
    record = scheduler.store.get(ids[1])
    assert (record.state, record.error, record.attempts) == ("cancelled", "changed my mind", 0)
    assert scheduler.position(ids[1]) is None and scheduler.position(ids[2]) == 2
    assert drain(scheduler) == [ids[0], ids[2]]
    assert results(scheduler, ids[1]) == []
    for job_id in (ids[0], ids[2]):
        assert results(scheduler, job_id) == direct(requests[ids.index(job_id)])


def test_cancel_the_running_job_stops_it_and_the_next_runs(make_scheduler, direct, hub):
    scheduler = make_scheduler("sd", events=hub)
    running = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1, "steps": 3})
    after = {**SMALL, "workflow": "sd", "seed": 2}
    hub.job = running.id
    with hub.subscribe(running.id) as listener:
        scheduler.start()
        assert hub.reached.wait(WAIT)
        nxt = scheduler.submit(after)
        assert scheduler.position(running.id) == 0 and scheduler.running is running
        assert scheduler.cancel(running.id, "the client left").state == "running"  # stops at its next step
        hub.release.set()
        assert scheduler.wait_idle(WAIT)
        events = []
        while (event := listener.get(timeout=0)) is not None:
            events.append(event)
    described = scheduler.describe(running.id)
    assert (described["state"], described["error"], described["results"]) == (
        "cancelled",
        "the client left",
        [],
    )
    assert [event["kind"] for event in events if event["kind"] in ("done", "failed", "cancelled")] == [
        "cancelled"
    ]
    assert max(event["step"] for event in events if event["kind"] == "step") < 3  # it stopped mid-loop
    assert scheduler.store.get(running.id).state == "cancelled"
    assert _final(scheduler, nxt.id) == "done"
    assert results(scheduler, nxt.id) == direct(after)


def test_cancel_a_finished_job_is_a_state_error(make_scheduler):
    scheduler = make_scheduler("sd")
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    drain(scheduler)
    with pytest.raises(JobStateError, match=rf"job '{job.id}' is done; there is nothing to cancel"):
        scheduler.cancel(job.id)
    cancelled = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    scheduler.cancel(cancelled.id)
    with pytest.raises(JobStateError, match="is cancelled"):
        scheduler.cancel(cancelled.id)
    assert _final(scheduler, job.id) == "done"


def test_cancel_an_unknown_job(make_scheduler):
    scheduler = make_scheduler("sd")
    with pytest.raises(UnknownJobError) as unknown:
        scheduler.cancel("nope")
    assert str(unknown.value) == "no job has id 'nope'"
    with pytest.raises(UnknownJobError):
        scheduler.describe("nope")


# -- pause, resume ---------------------------------------------------------------------------------------
def test_paused_queue_starts_nothing_by_hand_until_resumed(make_scheduler):
    scheduler = make_scheduler("sd")
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    with scheduler.events.subscribe() as listener:
        scheduler.pause()
        assert scheduler.paused and scheduler.run_next() is None
        assert _final(scheduler, job.id) == "queued" and scheduler.position(job.id) == 1
        scheduler.resume()
        assert [listener.get(timeout=0)["kind"] for _ in range(2)] == ["paused", "resumed"]
    assert drain(scheduler) == [job.id]


def test_pause_lets_the_running_job_finish_and_holds_the_next(make_scheduler, hub):
    scheduler = make_scheduler("sd", events=hub)
    first = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    hub.job = first.id
    scheduler.start()
    assert hub.reached.wait(WAIT)
    second = scheduler.submit({**SMALL, "workflow": "sd", "seed": 2})
    scheduler.pause()
    hub.release.set()
    assert not scheduler.wait_idle(0.5)  # the second job waits (a bound: it may not start at all)
    assert _final(scheduler, first.id) == "done"
    assert _final(scheduler, second.id) == "queued" and scheduler.position(second.id) == 1
    scheduler.resume()
    assert scheduler.wait_idle(WAIT)
    assert _final(scheduler, second.id) == "done"


# -- timeouts --------------------------------------------------------------------------------------------
class TimeoutHub(EventHub):
    """Holds the first step of every job with a timeout under a second until that job's cancel is set (its
    timer fired), so such a timeout always falls mid-call."""

    def __init__(self, scheduler_of) -> None:
        super().__init__()
        self.scheduler_of = scheduler_of

    def publish(self, kind, job_id=None, **fields):
        event = super().publish(kind, job_id, **fields)
        if kind == "step" and fields.get("step") == 1:
            job = self.scheduler_of().job(job_id)
            if job.request.timeout is not None and job.request.timeout < 1:
                assert job.token._event.wait(WAIT), "the timeout never fired"
        return event


def test_a_job_over_its_timeout_fails_and_the_next_runs(make_scheduler, direct):
    holder = {}
    scheduler = holder["s"] = make_scheduler("sd", events=TimeoutHub(lambda: holder["s"]))
    slow = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1, "timeout": 0.05})
    after = {**SMALL, "workflow": "sd", "seed": 2, "timeout": 600}
    nxt = scheduler.submit(after)
    assert drain(scheduler) == [slow.id, nxt.id]
    described = scheduler.describe(slow.id)
    assert (described["state"], described["error"], described["results"]) == (
        "failed",
        "timed out after 0.05 s",
        [],
    )
    assert scheduler.store.get(slow.id).error == "timed out after 0.05 s"
    assert _final(scheduler, nxt.id) == "done" and results(scheduler, nxt.id) == direct(after)


# -- stop and start --------------------------------------------------------------------------------------
def test_a_job_stopped_mid_call_runs_again_on_the_next_start(make_scheduler, direct, hub):
    scheduler = make_scheduler("sd", events=hub)
    request = {**SMALL, "workflow": "sd", "seed": 1, "steps": 3}
    job = scheduler.submit(request)
    hub.job = job.id
    scheduler.start()
    assert hub.reached.wait(WAIT)
    stopper = threading.Thread(target=scheduler.stop)
    stopper.start()
    hub.release.set()
    stopper.join(WAIT)
    described = scheduler.describe(job.id)
    assert (described["state"], described["attempts"], described["error"]) == ("queued", 1, None)
    assert scheduler.store.get(job.id).state == "queued"
    assert scheduler.position(job.id) == 1
    scheduler.start()
    assert scheduler.wait_idle(WAIT)
    described = scheduler.describe(job.id)
    assert (described["state"], described["attempts"]) == ("done", 2)
    assert results(scheduler, job.id) == direct(request)


def test_cancel_while_the_job_s_pipeline_loads_ends_it_cancelled_before_any_step(make_scheduler, monkeypatch):
    scheduler = make_scheduler("sd")
    loading, release = threading.Event(), threading.Event()
    load = scheduler.served.load

    def slow_load(name, on_cuda=False):
        loading.set()
        assert release.wait(WAIT)
        return load(name, on_cuda)

    monkeypatch.setattr(scheduler.served, "load", slow_load)
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    with scheduler.events.subscribe(job.id) as listener:
        scheduler.start()
        assert loading.wait(WAIT)
        scheduler.cancel(job.id, "no longer wanted")
        release.set()
        assert scheduler.wait_idle(WAIT)
        kinds = []
        while (event := listener.get(timeout=0)) is not None:
            kinds.append(event["kind"])
    described = scheduler.describe(job.id)
    assert (described["state"], described["error"], described["results"]) == (
        "cancelled",
        "no longer wanted",
        [],
    )
    assert "step" not in kinds and kinds[-1] == "cancelled"


class FakeTimer:
    """A ``threading.Timer`` that fires when the test says (the last one made is ``FakeTimer.made``)."""

    made: FakeTimer | None = None

    def __init__(self, interval, function, args=()):
        self.function, self.args = function, args
        self.daemon = False
        FakeTimer.made = self

    def start(self):
        pass

    def cancel(self):
        pass

    def fire(self):
        self.function(*self.args)


@pytest.mark.parametrize("then", ["stop", "timeout"])
def test_a_client_s_cancel_stands_when_a_stop_or_a_timeout_comes_after_it(
    make_scheduler, hub, monkeypatch, then
):
    """The first cancel of a running job decides how it ends: a stop after a client's cancel does not put
    the job back in the queue (it would run again after a restart), nor does a timeout make it failed."""
    monkeypatch.setattr(threading, "Timer", FakeTimer)
    scheduler = make_scheduler("sd", events=hub)
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1, "steps": 3, "timeout": 5})
    hub.job = job.id
    scheduler.start()
    assert hub.reached.wait(WAIT)
    scheduler.cancel(job.id, "the client left")
    stopper = threading.Thread(target=scheduler.stop)
    if then == "stop":
        stopper.start()
    else:
        FakeTimer.made.fire()
    hub.release.set()
    if then == "stop":
        stopper.join(WAIT)
    else:
        assert scheduler.wait_idle(WAIT)
    described = scheduler.describe(job.id)
    assert (described["state"], described["error"]) == ("cancelled", "the client left")
    assert scheduler.store.get(job.id).state == "cancelled"
    assert scheduler.waiting() == []
