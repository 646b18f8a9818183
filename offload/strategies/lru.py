"""Least recently used: evict the models used longest ago until the request fits."""

from __future__ import annotations

from offload.strategies.strategy import OffloadRequest, OffloadStrategy, take_until_enough

__all__ = ["LRUStrategy"]


class LRUStrategy(OffloadStrategy):
    """Evict the least recently used residents, oldest first, until enough bytes are free. Ignores the plan."""

    def select_victims(self, request: OffloadRequest) -> list[str]:
        order = sorted(request.residents, key=lambda model_id: request.last_used.get(model_id, -1))
        return take_until_enough(order, request.residents, request.shortfall, trim=False)
