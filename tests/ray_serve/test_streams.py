"""Each replica's expected wait from the streams this process follows and the replicas' reports (no Ray)."""

from __future__ import annotations

import threading

import pytest

from modular.ray_serve.streams import CHOSEN_SECONDS, StreamedJobs, seconds_per_byte, service_seconds, waits
from modular.serving import ResidencyReport

ME = "host:1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def streamed(clock):
    return StreamedJobs(clock)


def test_before_any_job_finished_the_waits_are_queue_lengths(streamed):
    reports = {"a": ResidencyReport(queued=3), "b": ResidencyReport()}
    assert waits(reports, "sd", streamed, ME) == {"a": 3.0, "b": 0.0}


def test_this_process_streams_count_as_they_are_now_not_as_the_report_counted_them(streamed, clock):
    # The report (older) counts three streams of this caller on "a"; two have ended since and one more went to
    # "b", which reported nothing of it yet.
    reports = {
        "a": ResidencyReport(queued=4, streamed={ME: 3, "other:2": 1}),
        "b": ResidencyReport(queued=0),
    }
    streamed.sent("r1", "a", "sd")
    streamed.sent("r2", "b", "sd")
    streamed.sent("r3", "b", "sd")
    clock.now += 0.0  # nothing has run yet
    assert waits(reports, "sd", streamed, ME) == {"a": 1.0 + 1.0, "b": 2.0}  # a: one of mine, one other's
    streamed.ended("r2")
    streamed.ended("unknown")  # a stream this table never saw (a submit's request): ignored
    assert waits(reports, "sd", streamed, ME)["b"] == 1.0


def test_waits_are_in_job_times_of_the_new_job_and_take_off_the_running_jobs_time(streamed, clock):
    reports = {
        "a": ResidencyReport(seconds={"sd": 2.0}),
        "b": ResidencyReport(seconds={"flux": 4.0}),
    }
    assert service_seconds(reports) == {"sd": 2.0, "flux": 4.0}
    odd = {"c": ResidencyReport(seconds={"sd": 0.0, "flux": float("nan"), "wan": float("inf")})}
    assert service_seconds({**reports, **odd}) == {"sd": 2.0, "flux": 4.0}  # no job takes 0 s: ignored
    streamed.sent("r1", "a", "flux")  # 4 s of work ahead of a new job on "a"
    streamed.sent("r2", "a", "sd")  # then 2 s
    assert waits(reports, "sd", streamed, ME)["a"] == pytest.approx((4.0 + 2.0) / 2.0)
    assert waits(reports, "flux", streamed, ME)["a"] == pytest.approx((4.0 + 2.0) / 4.0)
    clock.now += 3.0  # the first has run 3 of its 4 s
    assert waits(reports, "sd", streamed, ME)["a"] == pytest.approx((1.0 + 2.0) / 2.0)
    clock.now += 10.0  # it runs longer than its workflow's mean: counted as ending now, not less
    assert waits(reports, "sd", streamed, ME)["a"] == pytest.approx(2.0 / 2.0)
    streamed.ended("r1")  # the second starts when the first ends
    clock.now += 0.5
    assert waits(reports, "sd", streamed, ME)["a"] == pytest.approx(1.5 / 2.0)


def test_a_replica_that_would_move_the_jobs_models_waits_for_the_move_too(streamed):
    needs = {"unet": 1000, "vae": 200}
    reports = {
        "holder": ResidencyReport(missing={"unet": 0, "vae": 0}, queued=1, seconds={"sd": 2.0}),
        "empty": ResidencyReport(seconds={"sd": 2.0}, seconds_per_byte=0.003),
        "half": ResidencyReport(missing={"unet": 0}, seconds_per_byte=0.001),
    }
    assert seconds_per_byte(reports) == pytest.approx(0.002)  # pooled over the replicas that measured it
    assert waits(reports, "sd", streamed, ME, needs) == pytest.approx(
        {"holder": 1.0, "empty": 1200 * 0.002 / 2.0, "half": 200 * 0.002 / 2.0}
    )
    assert waits(reports, "sd", streamed, ME) == {
        "holder": 1.0,
        "empty": 0.0,
        "half": 0.0,
    }  # no needs: queues
    unmeasured = {key: ResidencyReport(missing=r.missing, queued=r.queued) for key, r in reports.items()}
    assert waits(unmeasured, "sd", streamed, ME, needs) == {"holder": 1.0, "empty": 0.0, "half": 0.0}
    odd = {"c": ResidencyReport(seconds_per_byte=float("inf")), "d": ResidencyReport(seconds_per_byte=-1.0)}
    assert seconds_per_byte({**reports, **odd}) == pytest.approx(0.002)  # no move costs that: ignored


def test_other_callers_jobs_ahead_leave_the_running_time_unknown(streamed, clock):
    reports = {"a": ResidencyReport(queued=2, seconds={"sd": 1.0}, streamed={ME: 1})}
    streamed.sent("r1", "a", "sd")
    clock.now += 0.9  # mine may still wait behind the other caller's job: no time is taken off
    assert waits(reports, "sd", streamed, ME) == {"a": 2.0}


def test_a_dead_replicas_streams_are_forgotten(streamed):
    streamed.sent("r1", "a", "sd")
    streamed.sent("r2", "b", "sd")
    streamed.forget("a")
    assert streamed.on("a") == [] and [job.replica for job in streamed.on("b")] == ["b"]


def test_a_job_chosen_and_never_accepted_stops_counting(streamed, clock):
    streamed.chosen("r1", "a", "sd")
    streamed.chosen("r2", "a", "sd")
    streamed.sent("r2", "b", "sd")  # accepted by another replica than the one first chosen
    streamed.chosen("r2", "a", "sd")  # a late choice does not undo an acceptance
    assert [job.accepted for job in streamed.on("a")] == [False]
    assert [job.replica for job in streamed.on("b")] == ["b"]
    clock.now += CHOSEN_SECONDS + 0.1  # r1 went nowhere (its caller gave up before any replica took it)
    assert streamed.on("a") == [] and len(streamed.on("b")) == 1


def test_hooks_from_two_threads_while_a_router_reads_lose_no_job(streamed):
    """Ray's hooks and a router may touch the table from different threads: every sent job is counted until it
    ends, and reading meanwhile never sees a torn table."""

    def send(prefix):
        for number in range(200):
            streamed.sent(f"{prefix}{number}", "a" if number % 2 else "b", "sd")
            if number % 4 == 0:
                streamed.ended(f"{prefix}{number}")

    errors = []

    def read():
        try:
            for _ in range(200):
                jobs, _ = streamed.by_replica()
                assert all(job.replica == replica for replica, on in jobs.items() for job in on)
        except Exception as error:  # raised in this thread: kept for the test's own assert
            errors.append(error)

    threads = [threading.Thread(target=send, args=(prefix,)) for prefix in "xy"] + [
        threading.Thread(target=read)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads) and errors == []
    assert len(streamed.on("a")) + len(streamed.on("b")) == 2 * (200 - 50)
