"""The peer's rule, as the baseline: evict the resident subset with the smallest total that frees enough."""

from __future__ import annotations

from offload.strategies.strategy import OffloadRequest, OffloadStrategy

__all__ = ["SmallestSufficientSet"]


class SmallestSufficientSet(OffloadStrategy):
    """Evict the subset of residents whose total size is the smallest that is still enough.

    This is the rule of diffusers' ``AutoOffloadStrategy``: every subset is considered (2^n); among
    those that free at least the shortfall, the one with the smallest total wins, the first found on
    ties, searching subsets by increasing count over the residents sorted largest first. If none is
    enough, everything is evicted. It ignores the plan and recency, so it may evict the model needed
    next; it is kept as the baseline the benchmarks compare against.
    """

    def select_victims(self, request: OffloadRequest) -> list[str]:
        sizes = sorted(request.residents.items(), key=lambda item: item[1], reverse=True)
        count = len(sizes)
        best_mask, best_total = None, None
        # Masks grouped by how many models they hold, then in lexicographic order of positions,
        # which is the order the peer's search meets them in.
        for members in range(1, count + 1):
            for mask in _masks_with_bits(count, members):
                total = sum(size for bit, (_, size) in enumerate(sizes) if mask >> bit & 1)
                if total >= request.shortfall and (best_total is None or total < best_total):
                    best_mask, best_total = mask, total
        if best_mask is None:
            return [model_id for model_id, _ in sizes]
        return [model_id for bit, (model_id, _) in enumerate(sizes) if best_mask >> bit & 1]


def _masks_with_bits(count: int, members: int):
    """Yield every ``count``-bit mask with ``members`` bits set, lowest positions first (lexicographic)."""

    def extend(start: int, remaining: int, mask: int):
        if remaining == 0:
            yield mask
            return
        for bit in range(start, count - remaining + 1):
            yield from extend(bit + 1, remaining - 1, mask | 1 << bit)

    yield from extend(0, members, 0)
