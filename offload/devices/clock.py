"""A simulated clock: when copies and forwards would start and end on a device with one copy engine.

A ``SimulatedDevice`` given ``h2d_bandwidth`` (and compute-time hints) makes the engine keep one, so the
time that prefetch hides can be measured and tested without a GPU. The model is a GPU's: one copy
stream and one compute stream, each doing one thing at a time. A copy made when the weights are needed
is issued once the compute before it is done (nothing to overlap it with); a prefetch is issued when the
compute it overlaps starts. A forward starts once the compute stream is free and its weights have
arrived.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

__all__ = ["SimulatedClock"]


class SimulatedClock:
    """Simulated seconds since the engine started, for copies (host to device) and forwards.

    Args:
        bandwidth: Host-to-device bytes per second.
        compute_time: Seconds one call of each model takes (models not named take none).
    """

    def __init__(self, bandwidth: float, compute_time: Mapping[str, float]):
        self.bandwidth = bandwidth
        self.compute_time = dict(compute_time)
        self.now = 0.0  # when the compute stream is free: the simulated wall time of the work so far
        self._compute_start = 0.0  # start of the latest forward: prefetches issued during it start then
        self._copy_free = 0.0
        self._ready: dict[object, float] = {}  # when the weights of a model (or group) have arrived
        self.copy_seconds = 0.0
        self.waited_seconds = 0.0  # compute-stream time spent waiting for copies
        self._lock = threading.Lock()  # hooks of streamed groups tick it outside the engine's lock

    def copy(self, key: object, nbytes: int, early: bool = False) -> tuple[float, float]:
        """Copy ``nbytes`` for ``key``; ``early`` for a prefetch (overlaps the forward in progress).

        Returns the copy's start and end.
        """
        with self._lock:
            issued = self._compute_start if early else self.now
            start = max(self._copy_free, issued)
            end = start + nbytes / self.bandwidth
            self._copy_free = end
            self._ready[key] = max(self._ready.get(key, 0.0), end)
            self.copy_seconds += end - start
            return start, end

    def compute(self, key: object, seconds: float) -> tuple[float, float]:
        """Run a forward of ``seconds`` that needs ``key``'s weights; returns its start and end."""
        with self._lock:
            ready = self._ready.pop(key, 0.0)
            start = max(self.now, ready)
            self.waited_seconds += start - self.now
            self._compute_start, self.now = start, start + seconds
            return start, self.now

    def seconds_for(self, model_id: str, share: float = 1.0) -> float:
        """Seconds of ``share`` of one call of ``model_id`` (a streamed group runs its share of the model)."""
        return self.compute_time.get(model_id, 0.0) * share
