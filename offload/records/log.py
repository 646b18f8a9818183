"""The record of every placement decision, printable as a table; with several devices, one record of all."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Iterator, Sequence

import attrs

from offload.devices.units import column_unit, format_bytes, format_in

__all__ = ["MergedOffloadLog", "OffloadDecision", "OffloadLog"]

# Numbers every decision appended to any log in this process, so the logs of several engines (one per
# device) read as one sequence in the order the decisions were made (``MergedOffloadLog``).
_ORDER = itertools.count()


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
            ``"evict"``, ``"detach"`` (taken from the engine), ``"close"`` (the engine closed: offload turned off or
            replaced), ``"shrink"`` (``model_id``, a victim, kept down to a resident prefix: its
            tail left the device; ``offload.partial.shrink``), ``"stream"`` (placed partly resident:
            ``offload.partial.beyond``), ``"stream tail"`` (the groups one call streamed in) or ``"prefetch"``; with a
            host budget (``offload.host.host_tier``) also ``"spill"`` (written to the spill folder), ``"drop host
            copy"`` (its host copy freed: the weights are on disk now) and ``"disk read"`` (read back into host
            memory).
        bytes_from_disk: Bytes read back from disk by this decision.
        bytes_to_disk: Bytes written to the spill folder by this decision.
        start: On a simulated clock (``SimulatedDevice(h2d_bandwidth=...)``), when its copy started, in
            simulated seconds; None otherwise.
        end: When that copy ended.
        device: The name of the device it was made for (its engine's); set by the engine's log.
        sizes: The weight bytes of ``model_id`` and then of each model in ``evicted``, as the engine knew them
            when the decision was made (the whole model's, whatever part of it moved); ``offload.records.
            offload_record`` reads them for each event's ``model_size``.
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
    device: str | None = None
    sizes: tuple[int, ...] = ()


_COLUMNS = ("#", "model", "evicted", "to device", "to host", "free before", "free after", "reason")
_DISK_COLUMNS = ("from disk", "to disk")  # shown once the log holds disk traffic


class OffloadLog:
    """A bounded sequence of ``OffloadDecision`` with running totals; ``str(log)`` is a table.

    Args:
        maxlen: How many decisions to keep; totals count every decision ever made.
        device: The name of the device the decisions are made for: given to each decision appended
            without one.

    Attributes:
        total_evictions: Models taken off the device whole (each name in a decision's ``evicted``).
        total_shrinks: Victims kept down to a resident prefix, their tail taken off (``"shrink"`` decisions).
    """

    def __init__(self, maxlen: int = 10_000, device: str | None = None):
        self.device = device
        self._entries: deque[tuple[int, OffloadDecision]] = deque(maxlen=maxlen)  # (order, decision)
        # An append and a clear from another thread (``cm.offload_record.clear()`` during a run) never
        # interleave: the count and the totals always match the decisions held.
        self._lock = threading.Lock()
        self.clear()  # sets the count and the totals

    @property
    def total_left_device(self) -> int:
        """Models that left the device, whole or in part: ``total_evictions`` plus ``total_shrinks``."""
        return self.total_evictions + self.total_shrinks

    def append(self, decision: OffloadDecision) -> None:
        """Record ``decision`` (given this log's device if it has none) and add it to the totals."""
        if decision.device is None and self.device is not None:
            decision = attrs.evolve(decision, device=self.device)
        with self._lock:
            self._entries.append((next(_ORDER), decision))
            self._count += 1
            self.total_bytes_to_device += decision.bytes_to_device
            self.total_bytes_to_host += decision.bytes_to_host
            self.total_evictions += len(decision.evicted)
            self.total_shrinks += decision.reason == "shrink"
            self.total_bytes_from_disk += decision.bytes_from_disk
            self.total_bytes_to_disk += decision.bytes_to_disk

    def clear(self) -> None:
        """Forget every decision and reset the totals."""
        with self._lock:
            self._entries.clear()
            self._count = 0
            self.total_bytes_to_device: int = 0
            self.total_bytes_to_host: int = 0
            self.total_evictions: int = 0
            self.total_shrinks: int = 0
            self.total_bytes_from_disk: int = 0
            self.total_bytes_to_disk: int = 0

    @property
    def dropped(self) -> int:
        """Decisions made but no longer held (past ``maxlen``); ``clear`` resets it."""
        return self._count - len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[OffloadDecision]:
        return (decision for _, decision in list(self._entries))

    def __getitem__(self, index: int) -> OffloadDecision:
        return self._entries[index][1]

    def __repr__(self) -> str:
        return (
            f"OffloadLog({self._count} decisions, to device {format_bytes(self.total_bytes_to_device)}, "
            f"to host {format_bytes(self.total_bytes_to_host)})"
        )

    def __str__(self) -> str:
        disk = bool(self.total_bytes_from_disk or self.total_bytes_to_disk)
        lines = _table(list(self), self._count - len(self._entries), disk, devices=False)
        return "\n".join([*lines, "total: " + _totals(self, disk)])


def _summed(attribute: str, doc: str) -> property:
    """A property of a merged log: the sum of ``attribute`` over its engines' logs."""
    return property(lambda merged: sum(getattr(log, attribute) for log in merged.logs), doc=doc)


class MergedOffloadLog:
    """The logs of several engines (one per device) read as one log: every decision in the order it was
    made, each with its ``device``; the totals are the sums. ``str(log)`` is a table with a device column,
    the totals, then each device's totals.

    A view: it holds no decision itself, so it always shows what the engines' logs hold; ``clear`` clears them.

    Args:
        logs: The engines' logs, in the order of their devices.
    """

    def __init__(self, logs: Sequence[OffloadLog]):
        self.logs = tuple(logs)

    @property
    def devices(self) -> list[str | None]:
        """The devices' names, in the order of ``logs``."""
        return [log.device for log in self.logs]

    def _ordered(self) -> list[OffloadDecision]:
        snapshots = [list(log._entries) for log in self.logs]
        return [decision for _, decision in heapq.merge(*snapshots, key=lambda entry: entry[0])]

    total_bytes_to_device = _summed(
        "total_bytes_to_device", "Host-to-device bytes of every decision on every device."
    )
    total_bytes_to_host = _summed(
        "total_bytes_to_host", "Device-to-host bytes of every decision on every device."
    )
    total_evictions = _summed("total_evictions", "Models taken off a device whole.")
    total_shrinks = _summed("total_shrinks", "Victims kept down to a resident prefix.")

    @property
    def total_left_device(self) -> int:
        """Models that left a device, whole or in part."""
        return self.total_evictions + self.total_shrinks

    total_bytes_from_disk = _summed(
        "total_bytes_from_disk", "Bytes read back from disk on every device's host tier."
    )
    total_bytes_to_disk = _summed("total_bytes_to_disk", "Bytes written to the spill folders.")

    @property
    def dropped(self) -> int:
        """Decisions made but no longer held, on every device."""
        return sum(log.dropped for log in self.logs)

    def clear(self) -> None:
        """Clear every engine's log."""
        for log in self.logs:
            log.clear()

    def __len__(self) -> int:
        return sum(len(log) for log in self.logs)

    def __iter__(self) -> Iterator[OffloadDecision]:
        return iter(self._ordered())

    def __getitem__(self, index: int) -> OffloadDecision:
        return self._ordered()[index]

    def __repr__(self) -> str:
        count = sum(log._count for log in self.logs)
        return (
            f"MergedOffloadLog({count} decisions on {self.devices}, to device "
            f"{format_bytes(self.total_bytes_to_device)}, to host {format_bytes(self.total_bytes_to_host)})"
        )

    def __str__(self) -> str:
        disk = bool(self.total_bytes_from_disk or self.total_bytes_to_disk)
        first = sum(log._count - len(log) for log in self.logs)
        lines = _table(self._ordered(), first, disk, devices=True)
        lines.append("total: " + _totals(self, disk))
        lines += [f"  {log.device}: {_totals(log, disk)}" for log in self.logs]
        return "\n".join(lines)


def _table(decisions: Sequence[OffloadDecision], first: int, disk: bool, devices: bool) -> list[str]:
    """The header, its rule and one row per decision (numbered from ``first + 1``)."""
    columns = _COLUMNS + _DISK_COLUMNS if disk else _COLUMNS
    if devices:
        columns = (columns[0], "device", *columns[1:])
    # Each size column in one unit, chosen from its largest value, as the components table prints sizes.
    sizes = {
        "to_device": [d.bytes_to_device for d in decisions],
        "to_host": [d.bytes_to_host for d in decisions],
        "free_before": [d.free_before for d in decisions],
        "free_after": [d.free_after for d in decisions],
        "from_disk": [d.bytes_from_disk for d in decisions],
        "to_disk": [d.bytes_to_disk for d in decisions],
    }
    unit = {column: column_unit(values) for column, values in sizes.items()}
    rows = [
        (
            str(first + i + 1),
            *((d.device or "-",) if devices else ()),
            d.model_id,
            ", ".join(d.evicted) or "-",
            format_in(d.bytes_to_device, unit["to_device"]),
            format_in(d.bytes_to_host, unit["to_host"]),
            format_in(d.free_before, unit["free_before"]),
            format_in(d.free_after, unit["free_after"]),
            d.reason,
            *(
                (format_in(d.bytes_from_disk, unit["from_disk"]), format_in(d.bytes_to_disk, unit["to_disk"]))
                if disk
                else ()
            ),
        )
        for i, d in enumerate(decisions)
    ]
    widths = [max(len(c), *(len(r[k]) for r in rows)) if rows else len(c) for k, c in enumerate(columns)]
    line = " | ".join(c.ljust(w) for c, w in zip(columns, widths))
    return [line, "-" * len(line), *(" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows)]


def _totals(log: OffloadLog | MergedOffloadLog, disk: bool) -> str:
    """The totals of ``log``: bytes each way, and how many models left the device, whole or down to a prefix."""
    text = (
        f"to device {format_bytes(log.total_bytes_to_device)}, to host {format_bytes(log.total_bytes_to_host)}, "
        f"left the device {log.total_left_device} ({log.total_evictions} whole, {log.total_shrinks} shrunk to "
        "a prefix)"
    )
    if disk:
        from_disk, to_disk = format_bytes(log.total_bytes_from_disk), format_bytes(log.total_bytes_to_disk)
        text += f", from disk {from_disk}, to disk {to_disk}"
    return text
