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

__all__ = ["DEFAULT_IMBALANCE", "ResidencyReport", "rank_replicas", "replica_report", "workflow_needs"]

K = TypeVar("K", bound=Hashable)

#: Jobs by which replicas' queues may differ before jobs go by queue length. Low, because a job waiting
#: behind a longer queue costs whole job times while the bytes it would save cost a fraction of one
#: (benchmarks/serving.py --ray --replicas 3: p95 1.8x Ray's default at 8, 0.4x at 2).
DEFAULT_IMBALANCE = 2


def _counts(values: Mapping[str, int]) -> dict[str, int]:
    return {str(key): int(value) for key, value in values.items()}


def _names(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(value) for value in values)


@attrs.frozen
class ResidencyReport:
    """One replica's state for routing.

    Attributes:
        missing: For each model the replica holds (by load ID), the bytes it would move to its device to run
            it now: 0 for a resident model, its size for one held on the host. A model it does not hold is
            absent (it would be read from its files, then moved: its whole size).
        queued: Jobs waiting or running on the replica.
        unloadable: Workflows the replica could not load (not enough memory): not sent there again.
    """

    missing: Mapping[str, int] = attrs.field(factory=dict, converter=_counts)
    queued: int = 0
    unloadable: tuple[str, ...] = attrs.field(default=(), converter=_names)

    def bytes_for(self, needs: Mapping[str, int]) -> int:
        """The bytes this replica would move for a job whose models are ``needs`` (load ID to size)."""
        return sum(self.missing.get(load_id, size) for load_id, size in needs.items())

    def as_dict(self) -> dict[str, Any]:
        return {"missing": dict(self.missing), "queued": self.queued, "unloadable": list(self.unloadable)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ResidencyReport:
        """A report from ``as_dict``'s values; an empty or unknown table is an empty replica's report."""
        return cls(
            missing=values.get("missing", {}),
            queued=values.get("queued", 0),
            unloadable=values.get("unloadable", ()),
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
    manager: ComponentsManager, pipes: Sequence[ModularPipeline], queued: int, unloadable: Sequence[str] = ()
) -> ResidencyReport:
    """This process's report: every model of ``pipes`` the manager holds, with the bytes still to move for it."""
    missing: dict[str, int] = {}
    for pipe in pipes:
        for load_id, _, found in pipeline_models(manager, pipe):
            if found is not None and isinstance(found[1], torch.nn.Module):
                missing[load_id] = device_bytes(manager, *found)
    return ResidencyReport(missing=missing, queued=queued, unloadable=_names(unloadable))


def rank_replicas(
    reports: Mapping[K, ResidencyReport],
    needs: Mapping[str, int],
    workflow: str | None = None,
    imbalance: int = DEFAULT_IMBALANCE,
) -> list[list[K]]:
    """The replicas in ranks, most preferred first, for a job of ``workflow`` whose models are ``needs``.

    By the bytes each would move (fewest first; replicas that move the same bytes share a rank, least
    queued first). When the queues are out of balance (the longest holds more than ``imbalance`` jobs more
    than the shortest), by queue length instead, as Ray's prefix-affinity router does for KV caches, so that
    one replica holding a popular model is not sent every job. Replicas that could not load ``workflow``
    come last, in one rank.

    Raises:
        ValueError: ``imbalance`` is negative.
    """
    if isinstance(imbalance, bool) or not isinstance(imbalance, int) or imbalance < 0:
        raise ValueError(f"imbalance must be a whole number of at least 0 (got {imbalance!r})")
    able = [key for key, report in reports.items() if workflow is None or workflow not in report.unloadable]
    unable = [key for key in reports if key not in able]
    queues = [reports[key].queued for key in able]
    balanced = not queues or max(queues) - min(queues) <= imbalance
    if balanced:
        rank_of = {key: reports[key].bytes_for(needs) for key in able}
    else:
        rank_of = {key: reports[key].queued for key in able}
    ranks: dict[int, list[K]] = {}
    for key in sorted(able, key=lambda key: (rank_of[key], reports[key].queued)):
        ranks.setdefault(rank_of[key], []).append(key)
    ordered = [ranks[value] for value in sorted(ranks)]
    return ordered + ([unable] if unable else [])
