"""The order of waiting jobs: fairness first, then priority, then model affinity, then arrival.

A job is *due* once it has waited ``max_wait`` seconds or been passed over ``max_bypass`` times (a job that
arrived later ran before it). Due jobs run first, highest priority first, then oldest first: so no job
waits much beyond ``max_wait`` (at most the job running when it fell due), whatever its priority. The others
run highest priority first and, within a priority, the one whose models cost least to bring to the device
(``modular/serving/cost.py``), so runs of jobs that share models stay together; ties go to the oldest.
Pure functions of the waiting jobs, the time and the costs, so tests drive them with a simulated clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import attrs

__all__ = ["Fairness", "Waiting", "order", "passed_over"]


def _positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        msg = f"{attribute.name} must be a number more than 0 (got {value!r})"
        raise ValueError(msg)


def _whole_positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{attribute.name} must be a whole number of at least 1 (got {value!r})"
        raise ValueError(msg)


@attrs.frozen
class Fairness:
    """How long a job may wait (seconds) and how many times it may be passed over before it runs next."""

    max_wait: float = attrs.field(default=60.0, validator=_positive)
    max_bypass: int = attrs.field(default=8, validator=_whole_positive)


class Waiting(Protocol):
    """What the order reads of a waiting job."""

    @property
    def seq(self) -> int: ...  # arrival number
    @property
    def priority(self) -> int: ...
    @property
    def arrived(self) -> float: ...  # clock time it was queued
    @property
    def bypassed(self) -> int: ...


W = TypeVar("W", bound=Waiting)


def is_due(job: Waiting, now: float, fairness: Fairness) -> bool:
    return now - job.arrived >= fairness.max_wait or job.bypassed >= fairness.max_bypass


def order(waiting: Sequence[W], now: float, cost: Callable[[W], int], fairness: Fairness) -> list[W]:
    """``waiting`` in the order they would run now (see the module docstring); ``cost`` is asked once per job."""
    due = sorted(
        (job for job in waiting if is_due(job, now, fairness)), key=lambda job: (-job.priority, job.seq)
    )
    rest = [job for job in waiting if not is_due(job, now, fairness)]
    costs = {id(job): cost(job) for job in rest}
    rest.sort(key=lambda job: (-job.priority, costs[id(job)], job.seq))
    return due + rest


def passed_over(waiting: Sequence[W], chosen: W) -> list[W]:
    """The jobs ``chosen`` passes over: those that arrived before it and still wait."""
    return [job for job in waiting if job.seq < chosen.seq and job is not chosen]
