"""What a server's latest jobs took: the figures a router weighs a replica's queue and its moves by.

A job's seconds are its compute plus the moves it made (its models brought to the device, read from their
files the first time). A server keeps, for each workflow, its latest finished jobs' seconds and the bytes
each moved (the offload log's count over the job); from them ``JobTimes`` gives each workflow's mean seconds
(``ResidencyReport.seconds``: how long its jobs hold the queue) and the seconds a byte moved costs
(``ResidencyReport.seconds_per_byte``: what a job that moves nothing saves, per byte, over one that moves), so
that a router can weigh the bytes a replica would move against the wait of another in one unit.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

__all__ = ["RECENT_JOBS", "JobTimes"]

#: Finished jobs of each workflow kept for its figures (of each kind: all, those that moved, those that did not).
RECENT_JOBS = 20


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class JobTimes:
    """The latest finished jobs of each workflow: seconds each ran and bytes each moved to the device.

    Args:
        keep: Jobs of each workflow kept, of each kind.
    """

    def __init__(self, keep: int = RECENT_JOBS) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a whole number of at least 1 (got {keep!r})")
        self.keep = keep
        self._all: dict[str, list[tuple[float, int]]] = {}  # every job: its seconds and bytes
        self._warm: dict[str, list[float]] = {}  # jobs that moved nothing: the workflow's compute alone
        self._cold: dict[str, list[tuple[float, int]]] = {}  # jobs that moved: their seconds and bytes
        self._lock = threading.Lock()  # the scheduler's worker adds while a report reads

    def add(self, workflow: str, seconds: float, moved: int) -> None:
        """A finished job of ``workflow``: it ran ``seconds`` and moved ``moved`` bytes to the device."""
        with self._lock:
            self._all[workflow] = [*self._all.get(workflow, []), (seconds, moved)][-self.keep :]
            if moved > 0:
                self._cold[workflow] = [*self._cold.get(workflow, []), (seconds, moved)][-self.keep :]
            else:
                self._warm[workflow] = [*self._warm.get(workflow, []), seconds][-self.keep :]

    def seconds(self) -> dict[str, float]:
        """Each workflow's mean seconds per job, moves included (how long a job of it holds the queue)."""
        with self._lock:
            return {workflow: _mean([seconds for seconds, _ in jobs]) for workflow, jobs in self._all.items()}

    def moved(self, workflow: str) -> list[int]:
        """The bytes each of ``workflow``'s latest jobs moved, first finished first."""
        with self._lock:
            return [nbytes for _, nbytes in self._all.get(workflow, [])]

    def seconds_per_byte(self) -> float:
        """Seconds a moved byte adds to a job: over the workflows that have jobs of both kinds, the seconds the
        jobs that moved took beyond the mean of those that did not, per byte they moved. 0 until measured (or
        where moves cost nothing measurable)."""
        extra, moved = 0.0, 0
        with self._lock:
            for workflow, cold in self._cold.items():
                warm = self._warm.get(workflow)
                if warm:
                    base = _mean(warm)
                    extra += sum(seconds - base for seconds, _ in cold)
                    moved += sum(nbytes for _, nbytes in cold)
        return max(0.0, extra / moved) if moved else 0.0
