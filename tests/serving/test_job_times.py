"""What a server's latest jobs took: each workflow's seconds and the seconds a moved byte adds to a job."""

from __future__ import annotations

import threading

import pytest

from modular.serving.job_times import JobTimes


def test_seconds_are_each_workflows_mean_moves_included():
    times = JobTimes()
    times.add("sd", 3.0, moved=100)
    times.add("sd", 1.0, moved=0)
    times.add("flux", 2.0, moved=0)
    assert times.seconds() == {"sd": 2.0, "flux": 2.0}
    assert times.moved("sd") == [100, 0] and times.moved("unknown") == []


def test_a_byte_costs_what_the_jobs_that_moved_took_beyond_those_that_did_not():
    times = JobTimes()
    times.add("sd", 1.5, moved=1000)  # 0.5 s beyond sd's warm 1 s
    times.add("sd", 1.0, moved=0)
    times.add("flux", 3.5, moved=1000)  # 1.5 s beyond flux's warm 2 s
    times.add("flux", 2.0, moved=0)
    assert times.seconds_per_byte() == pytest.approx((0.5 + 1.5) / 2000)


def test_no_figure_until_a_workflow_has_run_both_warm_and_cold():
    times = JobTimes()
    assert times.seconds_per_byte() == 0.0
    times.add("sd", 2.0, moved=500)  # the first job always moves: nothing to compare it with yet
    assert times.seconds_per_byte() == 0.0
    times.add("flux", 1.0, moved=0)  # warm, but another workflow's
    assert times.seconds_per_byte() == 0.0
    times.add("sd", 1.0, moved=0)
    assert times.seconds_per_byte() == pytest.approx(1.0 / 500)


def test_moves_that_cost_nothing_measurable_cost_zero_not_less():
    times = JobTimes()
    times.add("sd", 0.9, moved=100)  # noise: faster than the warm one
    times.add("sd", 1.0, moved=0)
    assert times.seconds_per_byte() == 0.0


def test_only_the_latest_jobs_of_each_kind_are_kept():
    times = JobTimes(keep=2)
    for seconds in (10.0, 1.0, 2.0):
        times.add("sd", seconds, moved=0)
    assert times.seconds() == {"sd": 1.5}
    times = JobTimes(keep=1)
    times.add("sd", 5.0, moved=10)
    times.add("sd", 1.0, moved=0)  # the cold job leaves the window of all jobs, not the window of cold ones
    assert times.seconds() == {"sd": 1.0} and times.seconds_per_byte() == pytest.approx(4.0 / 10)


@pytest.mark.parametrize("keep", [0, -1, 1.5, True, "20"])
def test_a_bad_window_is_refused(keep):
    with pytest.raises(ValueError, match="keep must be a whole number"):
        JobTimes(keep=keep)


def test_jobs_added_while_another_thread_reads_are_all_counted():
    times = JobTimes(keep=10_000)
    done = threading.Event()

    def read():
        while not done.is_set():
            times.seconds(), times.seconds_per_byte()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for number in range(2000):
            times.add("sd", 1.0, moved=number % 2)
    finally:
        done.set()
        reader.join()
    assert len(times.moved("sd")) == 2000
