"""The record of every placement decision, printable as a table."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import attrs

from offload.units import format_bytes

__all__ = ["OffloadDecision", "OffloadLog"]


@attrs.frozen
class OffloadDecision:
    """One decision of the engine.

    Attributes:
        time: ``time.time()`` when the decision was made.
        model_id: The incoming model (the one asked for).
        evicted: Models taken off the device to make room, in eviction order.
        bytes_to_device: Host-to-device bytes moved by this decision.
        bytes_to_host: Device-to-host bytes moved by this decision (0 unless weights changed on the device).
        free_before: Free device bytes (before the margin) when the decision started.
        free_after: Free device bytes after it.
        reason: ``"fits"``, ``"evict: <strategy>"``, ``"oom retry"``, ``"refresh"``, ``"remeasure"`` (its
            weights were added, swapped or resized: measured again, taken off the device first if it was on),
            ``"evict"``, ``"detach"``, ``"stream"`` (placed partly resident: ``offload.partial``), ``"stream
            tail"`` (the groups one call streamed in) or ``"prefetch"``; with a host budget (``offload.host_tier``) also ``"spill"`` (written to
            the spill folder), ``"drop host copy"`` (its host copy freed: the weights are on disk now) and
            ``"disk read"`` (read back into host memory).
        bytes_from_disk: Bytes read back from disk by this decision.
        bytes_to_disk: Bytes written to the spill folder by this decision.
        start: On a simulated clock (``SimulatedDevice(h2d_bandwidth=...)``), when its copy started, in
            simulated seconds; None otherwise.
        end: When that copy ended.
    """

    time: float
    model_id: str
    evicted: tuple[str, ...]
    bytes_to_device: int
    bytes_to_host: int
    free_before: int
    free_after: int
    reason: str
    bytes_from_disk: int = 0
    bytes_to_disk: int = 0
    start: float | None = None
    end: float | None = None


_COLUMNS = ("#", "model", "evicted", "to device", "to host", "free before", "free after", "reason")
_DISK_COLUMNS = ("from disk", "to disk")  # shown once the log holds disk traffic


class OffloadLog:
    """A bounded sequence of ``OffloadDecision`` with running totals; ``str(log)`` is a table.

    Args:
        maxlen: How many decisions to keep; totals count every decision ever made.
    """

    def __init__(self, maxlen: int = 10_000):
        self._entries: deque[OffloadDecision] = deque(maxlen=maxlen)
        self._count = 0
        self.total_bytes_to_device = 0
        self.total_bytes_to_host = 0
        self.total_evictions = 0
        self.total_bytes_from_disk = 0
        self.total_bytes_to_disk = 0

    def append(self, decision: OffloadDecision) -> None:
        """Record ``decision`` and add it to the totals."""
        self._entries.append(decision)
        self._count += 1
        self.total_bytes_to_device += decision.bytes_to_device
        self.total_bytes_to_host += decision.bytes_to_host
        self.total_evictions += len(decision.evicted)
        self.total_bytes_from_disk += decision.bytes_from_disk
        self.total_bytes_to_disk += decision.bytes_to_disk

    def clear(self) -> None:
        """Forget every decision and reset the totals."""
        self._entries.clear()
        self._count = 0
        self.total_bytes_to_device = 0
        self.total_bytes_to_host = 0
        self.total_evictions = 0
        self.total_bytes_from_disk = 0
        self.total_bytes_to_disk = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[OffloadDecision]:
        return iter(self._entries)

    def __getitem__(self, index: int) -> OffloadDecision:
        return self._entries[index]

    def __repr__(self) -> str:
        return (
            f"OffloadLog({self._count} decisions, to device {format_bytes(self.total_bytes_to_device)}, "
            f"to host {format_bytes(self.total_bytes_to_host)})"
        )

    def __str__(self) -> str:
        first = self._count - len(self._entries)
        disk = bool(self.total_bytes_from_disk or self.total_bytes_to_disk)
        columns = _COLUMNS + _DISK_COLUMNS if disk else _COLUMNS
        rows = [
            (
                str(first + i + 1),
                d.model_id,
                ", ".join(d.evicted) or "-",
                format_bytes(d.bytes_to_device),
                format_bytes(d.bytes_to_host),
                format_bytes(d.free_before),
                format_bytes(d.free_after),
                d.reason,
                *((format_bytes(d.bytes_from_disk), format_bytes(d.bytes_to_disk)) if disk else ()),
            )
            for i, d in enumerate(self._entries)
        ]
        widths = [max(len(c), *(len(r[k]) for r in rows)) if rows else len(c) for k, c in enumerate(columns)]
        line = " | ".join(c.ljust(w) for c, w in zip(columns, widths))
        out = [line, "-" * len(line)]
        out += [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        total = (
            f"total: to device {format_bytes(self.total_bytes_to_device)}, "
            f"to host {format_bytes(self.total_bytes_to_host)}, evictions {self.total_evictions}"
        )
        if disk:
            total += (
                f", from disk {format_bytes(self.total_bytes_from_disk)}, "
                f"to disk {format_bytes(self.total_bytes_to_disk)}"
            )
        out.append(total)
        return "\n".join(out)
