"""The order of waiting jobs: pure ``order`` on records, and a Scheduler over real tiny pipelines whose
fairness reads a simulated clock while ``run_next`` is driven by hand."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modular.serving import Fairness
from modular.serving.policy import is_due, order, passed_over

from .conftest import SMALL, drain


@attrs.define
class Record:
    seq: int
    priority: int = 0
    arrived: float = 0.0
    bypassed: int = 0
    cost: int = 0


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _cost(job: Record) -> int:
    return job.cost


# -- pure order ----------------------------------------------------------------------------------------
def test_cheapest_first_within_a_priority_then_arrival():
    jobs = [Record(1, cost=50), Record(2, cost=0), Record(3, cost=50), Record(4, cost=0)]
    assert [job.seq for job in order(jobs, 0.0, _cost, Fairness())] == [2, 4, 1, 3]


def test_priority_before_cost():
    jobs = [Record(1, priority=0, cost=0), Record(2, priority=3, cost=1000), Record(3, priority=-1, cost=0)]
    assert [job.seq for job in order(jobs, 0.0, _cost, Fairness())] == [2, 1, 3]


def test_a_job_past_max_wait_goes_first_whatever_the_priority_and_cost():
    fairness = Fairness(max_wait=10)
    jobs = [Record(1, priority=0, arrived=0.0, cost=999), Record(2, priority=9, arrived=5.0, cost=0)]
    assert [job.seq for job in order(jobs, 9.9, _cost, fairness)] == [2, 1]
    assert [job.seq for job in order(jobs, 10.0, _cost, fairness)] == [1, 2]


def test_a_job_passed_over_max_bypass_times_goes_first():
    fairness = Fairness(max_wait=1e9, max_bypass=3)
    jobs = [Record(1, cost=999, bypassed=2), Record(2, cost=0)]
    assert [job.seq for job in order(jobs, 0.0, _cost, fairness)] == [2, 1]
    jobs[0].bypassed = 3
    assert [job.seq for job in order(jobs, 0.0, _cost, fairness)] == [1, 2]


def test_passed_over_are_the_earlier_arrivals_still_waiting():
    jobs = [Record(1), Record(2), Record(3), Record(4)]
    assert [job.seq for job in passed_over(jobs, jobs[2])] == [1, 2]
    assert passed_over(jobs, jobs[0]) == []


def test_cost_is_asked_once_per_job_that_is_not_due():
    asked = []

    def cost(job: Record) -> int:
        asked.append(job.seq)
        return job.cost

    jobs = [Record(1, arrived=0.0), Record(2, arrived=50.0), Record(3, arrived=60.0)]
    order(jobs, 100.0, cost, Fairness(max_wait=45))
    assert sorted(asked) == [3]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_wait", 0),
        ("max_wait", -1.0),
        ("max_wait", "60"),
        ("max_wait", True),
        ("max_wait", None),
        ("max_bypass", 0),
        ("max_bypass", -3),
        ("max_bypass", 2.5),
        ("max_bypass", False),
        ("max_bypass", "8"),
    ],
)
def test_fairness_refuses_bad_values(field, value):
    with pytest.raises(ValueError) as refused:
        Fairness(**{field: value})
    message = str(refused.value)
    assert message.startswith(f"{field} must be ") and message.endswith(f"(got {value!r})")


def test_fairness_takes_good_values():
    assert Fairness(max_wait=0.5, max_bypass=1) == Fairness(0.5, 1)


records = st.lists(
    st.builds(
        Record,
        seq=st.just(0),
        priority=st.integers(-2, 2),
        arrived=st.floats(0, 100),
        bypassed=st.integers(0, 4),
        cost=st.integers(0, 3),
    ),
    max_size=12,
)


@settings(max_examples=50, deadline=None)
@given(
    jobs=records,
    now=st.floats(0, 150),
    max_wait=st.floats(1, 120),
    max_bypass=st.integers(1, 5),
)
def test_order_properties(jobs, now, max_wait, max_bypass):
    """Every job once; due jobs first; among the others priority never rises and, within a priority,
    cost never falls; ties go by arrival."""
    for seq, job in enumerate(jobs, 1):
        job.seq = seq
    fairness = Fairness(max_wait, max_bypass)
    ordered = order(jobs, now, _cost, fairness)
    assert sorted(job.seq for job in ordered) == [job.seq for job in jobs]
    due = [is_due(job, now, fairness) for job in ordered]
    assert due == sorted(due, reverse=True)
    rest = [job for job in ordered if not is_due(job, now, fairness)]
    keys = [(-job.priority, job.cost, job.seq) for job in rest]
    assert keys == sorted(keys)
    first = [job for job in ordered if is_due(job, now, fairness)]
    assert [(-job.priority, job.seq) for job in first] == sorted((-job.priority, job.seq) for job in first)


# -- a scheduler on a simulated clock ------------------------------------------------------------------
@pytest.fixture
def one_family_budget(sizes):
    """A simulated device that holds SD or Flux, never both."""
    budget = max(sizes["sd"], sizes["flux"])
    assert budget < sizes["sd"] + sizes["flux"]
    return budget


def _submit(scheduler, workflow, **fields):
    return scheduler.submit({**SMALL, "workflow": workflow, "seed": 1, **fields}).id


def _warm(scheduler, workflow):
    """Run one job of ``workflow`` so its models are on the device."""
    _submit(scheduler, workflow)
    drain(scheduler)
    assert scheduler.cost(workflow) == 0


def test_after_an_sd_job_waiting_sd_jobs_go_before_an_earlier_flux_job(make_scheduler, one_family_budget):
    clock = FakeClock()
    scheduler = make_scheduler("sd", "flux", budget=one_family_budget, clock=clock, prefetch=False)
    _warm(scheduler, "sd")
    flux = _submit(scheduler, "flux")
    sd = [_submit(scheduler, "sd") for _ in range(2)]
    assert scheduler.cost("flux") > 0
    assert drain(scheduler) == [*sd, flux]
    assert scheduler.describe(flux)["bypassed"] == 2


def test_without_affinity_jobs_run_in_arrival_order(make_scheduler, one_family_budget):
    scheduler = make_scheduler(
        "sd", "flux", budget=one_family_budget, clock=FakeClock(), prefetch=False, affinity=False
    )
    _warm(scheduler, "sd")
    ids = [_submit(scheduler, name) for name in ("flux", "sd", "flux", "sd")]
    assert drain(scheduler) == ids


def test_priorities_come_before_affinity(make_scheduler, one_family_budget):
    scheduler = make_scheduler("sd", "flux", budget=one_family_budget, clock=FakeClock(), prefetch=False)
    _warm(scheduler, "sd")
    sd = _submit(scheduler, "sd")
    flux = _submit(scheduler, "flux", priority=1)
    assert drain(scheduler) == [flux, sd]


def test_a_job_past_max_wait_runs_next_against_cheaper_and_higher_priority_jobs(
    make_scheduler, one_family_budget
):
    clock = FakeClock()
    scheduler = make_scheduler(
        "sd", "flux", budget=one_family_budget, clock=clock, prefetch=False, fairness=Fairness(max_wait=10)
    )
    _warm(scheduler, "sd")
    flux = _submit(scheduler, "flux")
    clock.now = 5.0
    cheap, urgent = _submit(scheduler, "sd"), _submit(scheduler, "sd", priority=9)
    clock.now = 9.0
    assert [job.id for job in scheduler.waiting()] == [urgent, cheap, flux]
    clock.now = 10.0
    assert [job.id for job in scheduler.waiting()] == [flux, urgent, cheap]
    assert scheduler.position(flux) == 1
    assert drain(scheduler) == [flux, urgent, cheap]


def test_a_job_passed_over_max_bypass_times_runs_next(make_scheduler, one_family_budget):
    scheduler = make_scheduler(
        "sd",
        "flux",
        budget=one_family_budget,
        clock=FakeClock(),
        prefetch=False,
        fairness=Fairness(max_wait=1e9, max_bypass=2),
    )
    _warm(scheduler, "sd")
    flux = _submit(scheduler, "flux")
    sd = [_submit(scheduler, "sd") for _ in range(3)]
    assert drain(scheduler) == [sd[0], sd[1], flux, sd[2]]
    assert scheduler.describe(flux)["bypassed"] == 2
