"""``LocalWorkers``: replicas of this process (``ReplicaWorker`` objects) as the ingress's ``Workers``, routed
by the same ranking as Ray's ``ResidencyRouter``.

For a program that wants the ingress's retries and routing without a cluster, and for tests of the
ingress that need no Ray. ``lose`` stands for a replica's death: its streams break at their next event, as
a dead Ray replica's do, and it takes no more calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from modular.ray_serve.worker import (
    REPLICA_METHODS,
    ReplicaWorker,
    UnknownReplicaError,
    job_replica,
    needs_table,
    request_workflow,
)
from modular.serving.jobs import UnknownJobError
from modular.serving.residency import DEFAULT_IMBALANCE, ResidencyReport, check_imbalance, rank_replicas

__all__ = ["LocalWorkers", "ReplicaLostError"]


class ReplicaLostError(RuntimeError):
    """The replica a call went to is gone (``LocalWorkers.lose``)."""


class LocalWorkers:
    """``workers`` (all serving the same workflows) as the ingress's ``Workers``.

    Args:
        workers: The replicas.
        imbalance: Job times by which a replica's queue may exceed the shortest and it still be chosen for the
            models it holds (``rank_replicas``; here each waiting job counts one).

    Raises:
        ValueError: no worker, or two with one id.
    """

    def __init__(self, workers: Sequence[ReplicaWorker], imbalance: float = DEFAULT_IMBALANCE) -> None:
        if not workers:
            raise ValueError("LocalWorkers needs at least one ReplicaWorker")
        self._workers = {worker.replica_id: worker for worker in workers}
        if len(self._workers) != len(workers):
            raise ValueError(f"two workers share an id: {[worker.replica_id for worker in workers]}")
        self.imbalance = check_imbalance(imbalance)
        self.needs = needs_table(workers[0].served)
        self._lost: set[str] = set()

    def choose(self, data: Mapping[str, Any]) -> ReplicaWorker:
        """The replica a new job of ``data`` goes to: fewest bytes to move, then the shortest queue."""
        alive = {key: worker for key, worker in self._workers.items() if key not in self._lost}
        if not alive:
            raise ReplicaLostError("every replica is lost")
        workflow = request_workflow((data,), {}, self.needs)
        reports = {
            key: ResidencyReport.from_dict(worker.record_routing_stats()) for key, worker in alive.items()
        }
        if workflow is None:
            return alive[min(alive, key=lambda key: reports[key].queued)]
        ranks = rank_replicas(reports, self.needs[workflow], workflow, self.imbalance)
        return alive[ranks[0][0]]  # each rank is in order of queue length

    async def run(
        self, data: Mapping[str, Any], images: Mapping[str, tuple[str, bytes]]
    ) -> AsyncIterator[dict[str, Any]]:
        worker = self.choose(data)
        stream = worker.run(dict(data), images)
        try:
            async for event in stream:
                if worker.replica_id in self._lost:
                    raise ReplicaLostError(f"replica {worker.replica_id} is lost")
                yield event
        finally:
            await stream.aclose()

    async def call(self, replica: str, method: str, *args: Any) -> Any:
        owner = replica if method in REPLICA_METHODS else job_replica(args[0] if args else None)
        worker = self._workers.get(owner) if owner is not None and owner not in self._lost else None
        if worker is None:
            if method in REPLICA_METHODS:
                raise UnknownReplicaError(replica, "none")
            raise UnknownJobError(str(args[0]) if args else "")
        return getattr(worker, method)(*args)

    def replicas(self) -> list[str]:
        return sorted(key for key in self._workers if key not in self._lost)

    def lose(self, replica: str) -> None:
        """Make ``replica`` as a dead one: its streams break, it takes no call, and it is closed."""
        self._lost.add(replica)
        self._workers[replica].close()

    def close(self) -> None:
        """Close every replica."""
        for worker in self._workers.values():
            worker.close()
