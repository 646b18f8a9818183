"""A Ray Serve request router that sends each job to the replica that would move the fewest bytes for it.

Each replica reports what it holds (``ReplicaWorker.record_routing_stats``: a ``ResidencyReport`` as JSON
values and the replica's id); Ray hands the latest report to the router as each replica's
``routing_stats``. The router is started with the table of each workflow's models and sizes (``needs``,
from ``needs_table``) and ranks the replicas for a ``submit`` with ``rank_replicas``: by each replica's
expected wait for the job (``modular/ray_serve/streams.py``: the streams this process follows as they are
now, the rest as the latest report counts them), the replicas within ``imbalance`` job times of the shortest
by the bytes each would move, fewest first, then the others by wait, replicas that could not load the
workflow last; a wait counts the time the replica would take to move what it lacks for the job (its
measured seconds per byte), so that bytes and queues compare in job times. Ray then takes the least loaded
replica of the first rank that accepts the request.
``run`` (the ingress's streamed job) is ranked as ``submit`` is. A call about one job (``describe``,
``cancel``, ``result``) goes to the replica its id names, and a call addressed to a replica (``queue``,
``pause``, ...: ``REPLICA_METHODS``) to that replica. Without reports yet, or for a request it cannot read,
the router does what Ray's default router does: two replicas at random, the less loaded first (power of two
choices). The router runs in the caller's process (the ingress); ``deployment_replicas`` reads the replicas
it sees (``modular/ray_serve/registry.py``), which Ray offers no other public way to list. This module
imports Ray: it is imported only when named (``modular.ray_serve.ResidencyRouter``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from modular.ray_serve import streams  # by module: Ray pickles this one by value (see registry.py)
from modular.ray_serve.registry import remember_router
from modular.ray_serve.worker import REPLICA_METHODS, job_replica, request_workflow
from modular.serving.residency import DEFAULT_IMBALANCE, ResidencyReport, check_imbalance, rank_replicas

__all__ = [
    "JOB_METHODS",
    "RANKED_METHODS",
    "ResidencyRouter",
    "router_kwargs",
]

#: The worker's methods whose first argument is a job id: sent to the replica that holds the job.
JOB_METHODS = frozenset({"describe", "cancel", "result"})
#: The worker's methods that take a new job: ranked by residency.
RANKED_METHODS = frozenset({"submit", "run"})


def router_kwargs(needs: Any, imbalance: Any = DEFAULT_IMBALANCE) -> dict[str, Any]:
    """``RequestRouterConfig.request_router_kwargs`` of a ``ResidencyRouter``, checked.

    Args:
        needs: Workflow to load ID to bytes (``needs_table``).
        imbalance: Job times by which a replica's expected wait may exceed the shortest and it still be chosen
            for the bytes it would save.

    Raises:
        TypeError: ``needs`` is not a table of workflow to load ID to bytes.
        ValueError: ``imbalance`` is not a number of at least 0.
    """
    imbalance = check_imbalance(imbalance)
    if not isinstance(needs, Mapping) or not all(
        isinstance(workflow, str)
        and isinstance(models, Mapping)
        and all(isinstance(key, str) and isinstance(size, int) for key, size in models.items())
        for workflow, models in needs.items()
    ):
        raise TypeError(f"needs must map each workflow to its load IDs and their bytes (got {needs!r})")
    return {"needs": {workflow: dict(models) for workflow, models in needs.items()}, "imbalance": imbalance}


class ResidencyRouter(RequestRouter):
    """Ranks a deployment's replicas by their residency reports (see the module docstring).

    Each request gets the replica ranked for it: not FIFO (Ray's ``FIFOMixin``, which its power-of-two router
    uses, hands a replica found for one request to the oldest pending one, whatever its workflow), and not by
    request id alone (``_get_pending_request_matching_internal_request_id``): the calls one request makes
    share its id (the ingress's pause of each replica), and one of them would get the replica found for
    another.

    Started by Ray with ``RequestRouterConfig.request_router_kwargs``: ``needs`` (workflow to load ID to
    bytes, ``needs_table``) and ``imbalance`` (jobs; default ``DEFAULT_IMBALANCE``).
    """

    needs: dict[str, dict[str, int]]
    imbalance: float

    def initialize_state(
        self, needs: Any = None, imbalance: float = DEFAULT_IMBALANCE, **unknown: Any
    ) -> None:
        """Keep the table of needs and the threshold of imbalance.

        Raises:
            TypeError: ``needs`` is not a table of workflow to load ID to bytes, or an unknown setting is given.
            ValueError: ``imbalance`` is not a number of at least 0.
        """
        if unknown:
            raise TypeError(f"ResidencyRouter takes needs and imbalance (got {sorted(unknown)})")
        checked = router_kwargs({} if needs is None else needs, imbalance)
        self.needs = checked["needs"]
        self.imbalance = checked["imbalance"]
        remember_router(self.app_name, self)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The candidates in ranks, most preferred first (see the module docstring)."""
        if pending_request is not None:
            ranked = self.rank(candidate_replicas, pending_request)
            if ranked is not None:
                return ranked
        # Ray's default choice, written here because Ray names its router only in a private module: two at
        # random; Ray sends to the one with the shorter queue that accepts.
        return (
            [random.sample(candidate_replicas, min(2, len(candidate_replicas)))] if candidate_replicas else []
        )

    def rank(
        self, candidates: list[RunningReplica], request: PendingRequest
    ) -> list[list[RunningReplica]] | None:
        """The ranks for ``request``, or ``None`` where Ray's default choice applies."""
        method = request.metadata.call_method
        if method in JOB_METHODS or method in REPLICA_METHODS:
            first = request.args[0] if request.args else None
            owner = job_replica(first) if method in JOB_METHODS else first
            owned = [replica for replica in candidates if replica.replica_id.unique_id == owner]
            return [owned] if owned else None  # gone (or not an id): any replica says it does not know it
        if method not in RANKED_METHODS or not hasattr(self, "needs"):
            return None
        workflow = request_workflow(request.args, request.kwargs, self.needs)
        if workflow is None or not any(replica.routing_stats for replica in candidates):
            return None
        # A replica that has not reported yet is new: an empty replica with nothing queued.
        by_id = {replica.replica_id.unique_id: replica for replica in candidates}
        reports = {
            key: ResidencyReport.from_dict(replica.routing_stats or {}) for key, replica in by_id.items()
        }
        needs = self.needs[workflow]
        expected = streams.waits(reports, workflow, streams.STREAMED, needs=needs)
        ranks = rank_replicas(reports, needs, workflow, self.imbalance, expected)
        if method == "run" and ranks and ranks[0]:  # Ray takes the first rank's least loaded: its first
            streams.STREAMED.chosen(request.metadata.internal_request_id, ranks[0][0], workflow)
        return [[by_id[key] for key in rank] for rank in ranks]

    def _get_pending_request_matching_internal_request_id(
        self, request_metadata: Any = None
    ) -> PendingRequest | None:
        # Ray's matching of a replica found to the request it was found for (a private method: Ray is pinned),
        # by the request itself, whose metadata its routing task passes; Ray's own by id where none is.
        for pending in self._pending_requests_to_fulfill:
            if pending.metadata is request_metadata and not pending.future.done():
                return pending
        return super()._get_pending_request_matching_internal_request_id(request_metadata)

    # Ray's hooks: a streamed job (``run``) lives as long as its request, so this process follows each one
    # from its replica's acceptance to its end (``streams.STREAMED``); a ``submit`` returns at once and is
    # left to the reports.
    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        if pending_request.metadata.call_method != "run" or not hasattr(self, "needs"):
            return
        workflow = request_workflow(pending_request.args, pending_request.kwargs, self.needs)
        if workflow is not None:
            streams.STREAMED.sent(
                pending_request.metadata.internal_request_id, replica_id.unique_id, workflow
            )

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        streams.STREAMED.ended(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        streams.STREAMED.forget(replica_id.unique_id)
