"""What one server holds, in a form another process can read: the ground for routing jobs between replicas.

A deployment of several servers (replicas, each with its own device and manager) sends each job to the
replica that would move the fewest bytes to run it. Each replica reports a ``ResidencyReport`` (JSON
values, so it crosses processes): for each model it holds, by load ID, the bytes it would still move to its
device for it now, and how many jobs it holds. A router, which knows each workflow's models and sizes
(``workflow_needs``), ranks the replicas with ``rank_replicas``. Nothing here imports a cluster library: the
same reports and ranking serve any router that can carry a table of numbers.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import torch

from components import ComponentsManager
from modular.pipeline.pipeline import ModularPipeline
from modular.serving.cost import device_bytes, file_bytes, pipeline_models
from offload.devices.storage import module_nbytes

__all__ = [
    "DEFAULT_IMBALANCE",
    "ResidencyReport",
    "check_imbalance",
    "rank_replicas",
    "replica_report",
    "workflow_needs",
]

K = TypeVar("K", bound=Hashable)

#: Job times by which a replica's expected wait (its queue, and the move of what it lacks for the job) may
#: exceed the shortest and it still be chosen for the models it holds. One: in benchmarks/serving.py --ray
#: (2 replicas, 3 runs of 40 jobs, moves of half a job time) it moved 0.12x the default router's bytes at
#: 0.73x its p95 at load 1.5, 0.33x at 1.17x at load 1 (0.45x at 1.44x over 5 runs: near saturation a job
#: held back for its models costs the queue); 0.5 moved more at no better p95 (0.24x / 0.86x, 0.54x / 1.20x).
DEFAULT_IMBALANCE = 1.0


def _counts(values: Mapping[str, int]) -> dict[str, int]:
    return {str(key): int(value) for key, value in values.items()}


def _names(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(value) for value in values)


def _seconds(values: Mapping[str, float]) -> dict[str, float]:
    return {str(key): float(value) for key, value in values.items()}


@attrs.frozen
class ResidencyReport:
    """One replica's state for routing.

    Attributes:
        missing: For each model the replica holds (by load ID), the bytes it would move to its device to run
            it now: 0 for a resident model, its size for one held on the host. A model it does not hold is
            absent (it would be read from its files, then moved: its whole size).
        queued: Jobs waiting or running on the replica.
        unloadable: Workflows the replica could not load (not enough memory): not sent there again.
        seconds: The mean seconds a job of each workflow has taken on the replica (its latest finished ones).
        streamed: Of the ``queued`` jobs, how many each caller follows as a stream, by caller id: a router in
            that caller's process knows those jobs itself, as they happen, and counts only the others here.
        seconds_per_byte: The seconds a byte moved to the device has added to a job here (measured:
            ``modular/serving/job_times.py``); 0 until measured.
    """

    missing: Mapping[str, int] = attrs.field(factory=dict, converter=_counts)
    queued: int = 0
    unloadable: tuple[str, ...] = attrs.field(default=(), converter=_names)
    seconds: Mapping[str, float] = attrs.field(factory=dict, converter=_seconds)
    streamed: Mapping[str, int] = attrs.field(factory=dict, converter=_counts)
    seconds_per_byte: float = attrs.field(default=0.0, converter=float)

    def bytes_for(self, needs: Mapping[str, int]) -> int:
        """The bytes this replica would move for a job whose models are ``needs`` (load ID to size)."""
        return sum(self.missing.get(load_id, size) for load_id, size in needs.items())

    def as_dict(self) -> dict[str, Any]:
        return {
            "missing": dict(self.missing),
            "queued": self.queued,
            "unloadable": list(self.unloadable),
            "seconds": dict(self.seconds),
            "streamed": dict(self.streamed),
            "seconds_per_byte": self.seconds_per_byte,
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ResidencyReport:
        """A report from ``as_dict``'s values; an empty or unknown table is an empty replica's report."""
        return cls(
            missing=values.get("missing", {}),
            queued=values.get("queued", 0),
            unloadable=values.get("unloadable", ()),
            seconds=values.get("seconds", {}),
            streamed=values.get("streamed", {}),
            seconds_per_byte=values.get("seconds_per_byte", 0.0),
        )


def workflow_needs(manager: ComponentsManager, pipe: ModularPipeline) -> dict[str, int]:
    """``pipe``'s models by load ID with their sizes: the engine's count for a loaded model, else its weight files'."""
    needs: dict[str, int] = {}
    for load_id, spec, found in pipeline_models(manager, pipe):
        if found is None:
            needs[load_id] = file_bytes(str(spec.pretrained_model_name_or_path), spec.subfolder)
            continue
        component_id, component = found
        if not isinstance(component, torch.nn.Module):
            continue
        engines = [engine for engine in manager.offload_engines if engine.has_hook(component_id)]
        needs[load_id] = engines[0].nbytes(component_id) if engines else module_nbytes(component)
    return needs


def replica_report(
    manager: ComponentsManager,
    pipes: Sequence[ModularPipeline],
    queued: int,
    unloadable: Sequence[str] = (),
    seconds: Mapping[str, float] | None = None,
    seconds_per_byte: float = 0.0,
) -> ResidencyReport:
    """This process's report: every model of ``pipes`` the manager holds, with the bytes still to move for it."""
    missing: dict[str, int] = {}
    for pipe in pipes:
        for load_id, _, found in pipeline_models(manager, pipe):
            if found is not None and isinstance(found[1], torch.nn.Module):
                missing[load_id] = device_bytes(manager, *found)
    return ResidencyReport(
        missing=missing,
        queued=queued,
        unloadable=unloadable,
        seconds=seconds or {},
        seconds_per_byte=seconds_per_byte,
    )


def check_imbalance(imbalance: Any) -> float:
    """``imbalance`` as a number of job times.

    Raises:
        ValueError: it is not a number of at least 0.
    """
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) or not imbalance >= 0:
        raise ValueError(f"imbalance must be a number of job times of at least 0 (got {imbalance!r})")
    return float(imbalance)


def rank_replicas(
    reports: Mapping[K, ResidencyReport],
    needs: Mapping[str, int],
    workflow: str | None = None,
    imbalance: float = DEFAULT_IMBALANCE,
    waits: Mapping[K, float] | None = None,
) -> list[list[K]]:
    """The replicas in ranks, most preferred first, for a job of ``workflow`` whose models are ``needs``.

    Each replica's wait is how long the job would wait there before it starts, in job times: ``waits`` (a
    router that follows its jobs knows it better than a report), else the report's ``queued``. The replicas
    whose wait is within ``imbalance`` of the shortest rank by the bytes each would move (fewest first;
    those that move the same bytes share a rank, shortest wait first); the others follow by wait, so that one
    replica holding a popular model is not sent every job (as Ray's prefix-affinity router falls back to the
    least loaded replica). Replicas that could not load ``workflow`` come last, in one rank.

    Raises:
        ValueError: ``imbalance`` is negative or not a number.
    """
    imbalance = check_imbalance(imbalance)
    wait = {key: float(report.queued) for key, report in reports.items()}
    wait.update(waits or {})
    able = [key for key, report in reports.items() if workflow is None or workflow not in report.unloadable]
    unable = [key for key in reports if key not in able]
    shortest = min((wait[key] for key in able), default=0.0)
    near = [key for key in able if wait[key] <= shortest + imbalance]
    ranks: dict[tuple[int, float], list[K]] = {}
    for key in able:
        rank = (0, reports[key].bytes_for(needs)) if key in near else (1, wait[key])
        ranks.setdefault(rank, []).append(key)
    ordered = [sorted(ranks[rank], key=lambda key: wait[key]) for rank in sorted(ranks)]
    return ordered + ([unable] if unable else [])
