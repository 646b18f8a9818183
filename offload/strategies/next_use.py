"""The default strategy: evict the models needed furthest ahead, and no more bytes than needed."""

from __future__ import annotations

from collections import Counter

from offload.strategies.strategy import OffloadRequest, OffloadStrategy, take_until_enough

__all__ = ["NextUseStrategy"]


class NextUseStrategy(OffloadStrategy):
    """Evict by next use, weighted by size.

    Models the running pipeline call still needs (``request.upcoming``) are evicted last, ranked by
    distance to their next use divided by their size: far and small first, since bringing a small
    model back costs few bytes while a big one needed soon (the denoiser) costs many. Every other resident is ranked by how likely the next call is to
    need it: the share of recent plans that used it (the running pipeline usually runs again, so its
    own models rank high). Among equally likely ones, which will all be reloaded, the smaller goes
    first, then the one the running plan uses later, then the least recently used. Victims are taken
    in that order until enough bytes are free; then each victim whose eviction turned out unnecessary
    (the ones after it already free enough) is kept, most valuable first. So a text encoder used once
    per image is evicted before the denoiser, and no model is evicted alongside a big one for nothing.
    Without a plan this is size-aware recency.

    Its victims may be shrunk to a resident prefix instead (``offload.partial.shrink``): it ranks by bytes to
    bring back, and a kept prefix only lowers them. Strategies that want their victims off the device
    whole (headroom kept, the peer's rule) leave ``shrink_victims`` unset.
    """

    shrink_victims = True

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
                # Needed again in this call: far and small goes first (it costs few bytes to bring back).
                return (0, (next_use[model_id] + 1) / max(size, 1), 0, 0, 0)
            return (
                1,
                -share[model_id],
                -size,
                -first_in_current.get(model_id, 0),
                -request.last_used.get(model_id, -1),
            )

        order = sorted(request.residents, key=eviction_rank, reverse=True)
        return take_until_enough(order, request.residents, request.shortfall, trim=True)
