"""Bounds for offload traces: the exact offline optimum and the best online expectation.

Used by ``benchmarks/offload_traces.py``; a trace is anything with ``sizes`` (name -> bytes), ``runs``
(workflows with ``unrolled()``), ``budget``, ``margin`` and, for random mixes, ``mix``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Trace = Any  # benchmarks/offload_traces.py: Trace


# -- exact offline optimum, and the best online expectation -----------------------------------
class ResidentSets:
    """Resident sets of one trace as bit masks, and the sets worth moving to at a miss.

    Evicting is free (host copies are kept), so at a miss only the maximal subsets of the residents
    that still fit beside the requested model are worth keeping.
    """

    def __init__(self, trace: Trace):
        self.names = list(trace.sizes)
        self.size = [trace.sizes[n] for n in self.names]
        self.capacity = trace.budget - trace.margin
        self._moves: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def bytes(self, mask: int) -> int:
        return sum(size for i, size in enumerate(self.size) if mask >> i & 1)

    def indices(self, models: Sequence[str]) -> list[int]:
        """Positions of ``models``, repeats in a row collapsed (a hit moves nothing)."""
        out = [self.names.index(m) for m in models]
        return [r for i, r in enumerate(out) if i == 0 or r != out[i - 1]]

    def moves(self, mask: int, r: int) -> list[tuple[int, int]]:
        """(next resident set, bytes moved in) for each sensible answer to a use of model ``r``."""
        if mask >> r & 1:
            return [(mask, 0)]
        key = (mask, r)
        if key not in self._moves:
            members = [i for i in range(len(self.size)) if mask >> i & 1]
            room = self.capacity - self.size[r]
            fits = []
            for pick in range(1 << len(members)):
                sub = sum(1 << i for k, i in enumerate(members) if pick >> k & 1)
                if self.bytes(sub) <= room:
                    fits.append(sub)
            maximal = [s for s in fits if not any(o != s and o & s == s for o in fits)]
            self._moves[key] = [(sub | 1 << r, self.size[r]) for sub in maximal]
        return self._moves[key]


def optimum(trace: Trace) -> int:
    """Fewest host-to-device bytes for the trace: exact search over resident sets.

    A state that holds a superset of another at no higher cost dominates it.
    """
    sets = ResidentSets(trace)
    states = {0: 0}
    for r in sets.indices(trace.requests()):
        nxt: dict[int, int] = {}
        for mask, cost in states.items():
            for new, moved in sets.moves(mask, r):
                if cost + moved < nxt.get(new, float("inf")):
                    nxt[new] = cost + moved
        states = {m: c for m, c in nxt.items() if not any(o != m and o & m == m and nxt[o] <= c for o in nxt)}
    return min(states.values())


def best_online(trace: Trace) -> int:
    """Host-to-device bytes of the online policy with the least expected bytes, on this trace.

    The policy knows the workflows of ``trace.mix``, that each run is drawn uniformly and
    independently from them, how many runs are left, and the running call's plan: what a perfect
    online strategy could know. At each miss it picks the resident set with the least bytes moved now
    plus expected bytes later (dynamic programming over resident sets). It is optimal in expectation,
    not on every draw, so a lucky strategy may beat it on one trace.
    """
    sets = ResidentSets(trace)
    fits = [m for m in range(1 << len(sets.size)) if sets.bytes(m) <= sets.capacity]
    plans = [sets.indices(w.unrolled()) for w in trace.mix]

    def through_call(plan: list[int], after: dict[int, float]) -> list[dict[int, float]]:
        # cost[j][mask]: least expected bytes from the j-th use of ``plan`` on, then ``after``.
        cost = [after]
        for r in reversed(plan):
            later = cost[0]
            cost.insert(0, {m: min(moved + later[new] for new, moved in sets.moves(m, r)) for m in fits})
        return cost

    expected = [dict.fromkeys(fits, 0.0)]  # expected[k]: with k runs left, before the draw
    for _ in trace.runs:
        calls = [through_call(plan, expected[-1])[0] for plan in plans]
        expected.append({m: sum(c[m] for c in calls) / len(calls) for m in fits})
    mask, moved_in = 0, 0
    for done, run in enumerate(trace.runs):
        plan = sets.indices(run.unrolled())
        cost = through_call(plan, expected[len(trace.runs) - done - 1])
        for j, r in enumerate(plan):
            mask, moved = min(sets.moves(mask, r), key=lambda move: move[1] + cost[j + 1][move[0]])
            moved_in += moved
    return moved_in
