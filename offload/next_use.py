"""The default strategy: evict the models needed furthest ahead, and no more bytes than needed."""

from __future__ import annotations

from collections import Counter

from offload.strategy import OffloadRequest, OffloadStrategy, take_until_enough

__all__ = ["NextUseStrategy"]


class NextUseStrategy(OffloadStrategy):
    """Evict by next use, weighted by size.

    Models the running pipeline call still needs (``request.upcoming``) are evicted last, the one
    needed furthest ahead first. Every other resident is ranked by how likely the next call is to
    need it: the share of recent plans that used it (the running pipeline usually runs again, so its
    own models rank high), then by how early the running plan uses it next time, then by recency.
    Victims are taken in that order until enough bytes are free; then each victim whose eviction was
    unnecessary (the bigger ones after it already free enough) is kept, soonest needed first. So a
    text encoder used once per image is evicted before the denoiser that runs every step, and a small
    model is not evicted alongside a big one for nothing. Without a plan this is size-aware recency.
    """

    def select_victims(self, request: OffloadRequest) -> list[str]:
        next_use: dict[str, int] = {}
        for position, model_id in enumerate(request.upcoming):
            next_use.setdefault(model_id, position)
        plans = request.recent_plans
        share = Counter(m for plan in plans for m in set(plan))
        current = plans[-1] if plans else ()
        first_in_current = {m: len(current) - i for i, m in reversed(list(enumerate(current)))}

        def eviction_rank(model_id: str) -> tuple:
            # The highest rank is evicted first.
            size = request.residents[model_id]
            if model_id in next_use:
                return (0, next_use[model_id], 0, 0, size)
            return (
                1,
                -share[model_id],
                -first_in_current.get(model_id, 0),
                -request.last_used.get(model_id, -1),
                size,
            )

        order = sorted(request.residents, key=eviction_rank, reverse=True)
        return take_until_enough(order, request.residents, request.shortfall, trim=True)
