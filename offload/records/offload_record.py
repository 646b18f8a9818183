"""The peer's offload record (``cm.offload_record`` in diffusers' newest manager) read from our decision log.

One record, not a second bookkeeping: ``OffloadRecord`` holds no event of its own. Each time it is read, it
turns the decisions of the log it follows (``offload.records.log``) into the peer's events, one model each:

==========================  ======================================================================
decision reason             events
==========================  ======================================================================
``fits``, ``evict: <s>``    an ``offload`` per evicted model (reason ``needed_by:<model>``), then
                            the ``onload`` of the model (reason ``None``)
``stream``, ``prefetch``,   the same, the onload's reason naming the kind: placed partly resident,
``pinned``                  copied ahead of its call, attached where it stays
``oom retry``               an ``oom`` of the model whose forward ran out of memory, then an
                            ``offload`` per model taken off for the retry (``oom_retry:<model>``)
``shrink``                  an ``offload`` of the victim (reason ``shrink``): its tail left the
                            device, a resident prefix stays, so ``peak_co_residency`` still counts it
``evict``, ``remeasure``    an ``offload`` (reason ``evict`` / ``remeasure``)
``detach``, ``close``       an ``offload`` (``component_removed`` / ``offloading_disabled``)
others                      none: ``stream tail`` (groups one call streams in and drops), host-tier
                            moves, ``attach``, ``refresh`` move no model on or off the device
==========================  ======================================================================

Sizes are whole models (``model_size``, the peer's meaning); ``cm.offload_log`` has the bytes each decision
moved. May import ``offload.devices`` and ``offload.records``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import attrs

from offload.devices.units import format_bytes
from offload.records.log import OffloadDecision

__all__ = ["OFFLOAD_RECORD_MAXLEN", "OffloadEvent", "OffloadRecord", "events_of"]

# How many events ``OffloadRecord.events`` holds at most, the newest kept: the peer's bound. A step of a
# pipeline makes a handful, so this covers a long run and stays bounded in a long-lived server.
OFFLOAD_RECORD_MAXLEN = 10_000

# The onload reasons of the decisions that place a model, by the decision's reason (None: a plain placement).
_ONLOAD_REASONS = {"fits": None, "stream": "stream", "prefetch": "prefetch", "pinned": "pinned"}
# Decisions that take their own model off the device, and the peer's reason for each.
_OFFLOAD_REASONS = {
    "evict": "evict",
    "remeasure": "remeasure",
    "shrink": "shrink",
    "detach": "component_removed",
    "close": "offloading_disabled",
}


@attrs.frozen
class OffloadEvent:
    """One model moving, as the peer's record has it.

    Attributes:
        action: ``"onload"`` (onto the device), ``"offload"`` (off it) or ``"oom"`` (its forward ran out of
            device memory; the retry's offloads follow).
        model_id: The component id of the model.
        model_size: Its weight bytes (the whole model's).
        reason: Why it moved: ``needed_by:<id>`` (room for that model), ``oom_retry:<id>``, or a kind
            (``prefetch``, ``stream``, ``shrink``, ``evict``, ``offloading_disabled``, ...); ``None`` for an
            onload that is a plain placement.
        available_memory: On an onload, the device's free bytes before its decision; ``None`` otherwise.
        offloaded: On an onload, the models taken off the device to make room for it.
        device: The device's name (one of several, with several devices).
        time: ``time.time()`` of the decision.
    """

    action: str
    model_id: str
    model_size: int | None = None
    reason: str | None = None
    available_memory: int | None = None
    offloaded: tuple[str, ...] = ()
    device: str | None = None
    time: float = 0.0


def events_of(decision: OffloadDecision) -> list[OffloadEvent]:
    """The peer's events of one of our decisions (the table in this module's docstring)."""
    sizes = dict(zip((decision.model_id, *decision.evicted), decision.sizes))

    def event(action: str, model_id: str, reason: str | None = None, onload: bool = False) -> OffloadEvent:
        return OffloadEvent(
            action,
            model_id,
            sizes.get(model_id),
            reason,
            available_memory=decision.free_before if onload else None,
            offloaded=decision.evicted if onload else (),
            device=decision.device,
            time=decision.time,
        )

    reason, model_id = decision.reason, decision.model_id
    if reason in _ONLOAD_REASONS or reason.startswith("evict: "):
        offloads = [event("offload", victim, f"needed_by:{model_id}") for victim in decision.evicted]
        return [*offloads, event("onload", model_id, _ONLOAD_REASONS.get(reason), onload=True)]
    if reason == "oom retry":
        retries = [event("offload", victim, f"oom_retry:{model_id}") for victim in decision.evicted]
        return [event("oom", model_id), *retries]
    if reason in _OFFLOAD_REASONS:
        # "shrink" names its victim as the model and evicts nothing whole; the others evict the model itself.
        if reason == "shrink" or decision.evicted:
            return [event("offload", model_id, _OFFLOAD_REASONS[reason])]
    return []


class DecisionSource(Protocol):
    """What the record reads: ``offload.OffloadLog`` or ``offload.MergedOffloadLog``."""

    def __iter__(self) -> Iterator[OffloadDecision]: ...

    def clear(self) -> None: ...

    @property
    def dropped(self) -> int: ...


class OffloadRecord:
    """The peer's ``cm.offload_record``: the moves of auto offload as events, their summary and a table.

    A view of a decision log (``follow`` sets which): every read derives the events afresh, so it always says
    what the log holds; ``clear`` clears that log. The manager follows the log of the engines it turns on
    and keeps following it after ``disable_auto_cpu_offload()`` (the account of the run that ended); turning
    offload on again starts from a new engine's empty log, as the peer clears its record then.

    Args:
        maxlen: How many events ``events`` holds at most, the newest kept (``OFFLOAD_RECORD_MAXLEN``).
    """

    def __init__(self, maxlen: int = OFFLOAD_RECORD_MAXLEN) -> None:
        self._source: DecisionSource | None = None
        self.maxlen = maxlen

    @property
    def maxlen(self) -> int:
        """The bound of ``events``: how many of the newest events it holds."""
        return self._maxlen

    @maxlen.setter
    def maxlen(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            msg = f"OffloadRecord.maxlen must be a positive int (how many events to hold), not {value!r}."
            raise ValueError(msg)
        self._maxlen = value

    def follow(self, source: DecisionSource | None) -> None:
        """Read the decisions of ``source`` from now on (``None``: nothing recorded)."""
        self._source = source

    def _all_events(self) -> list[OffloadEvent]:
        decisions: Iterable[OffloadDecision] = () if self._source is None else list(self._source)
        return [event for decision in decisions for event in events_of(decision)]

    @property
    def events(self) -> deque[OffloadEvent]:
        """The newest events, oldest first, at most ``maxlen`` of them (a new deque at each read)."""
        return deque(self._all_events(), maxlen=self._maxlen)

    @events.setter
    def events(self, value: deque[OffloadEvent]) -> None:
        # The peer's tests give the record a new, empty deque(maxlen=n): here that empties it (``clear``)
        # and sets the bound, so the record ends as theirs does.
        if not isinstance(value, deque) or value.maxlen is None or len(value):
            msg = (
                "offload_record.events is read from the offload log; only its bound can be set: give an empty "
                "deque(maxlen=n) (which also clears the record, as in the peer), or set offload_record.maxlen = n."
            )
            raise TypeError(msg)
        self.maxlen = value.maxlen
        self.clear()

    @property
    def dropped(self) -> int:
        """At least how many events the record no longer holds: those past ``maxlen``, and one for each
        decision the log itself let go (its own bound)."""
        past_bound = max(len(self._all_events()) - self._maxlen, 0)
        return past_bound + (0 if self._source is None else self._source.dropped)

    def clear(self) -> None:
        """Forget every event: clears the log it reads (``cm.offload_log`` too, with its totals: one record)."""
        if self._source is not None:
            self._source.clear()

    def summary(self) -> dict[str, Any]:
        """The peer's numbers over ``events``: ``onloads``, ``offloads``, ``bytes_onloaded``, ``bytes_offloaded``
        (whole-model sizes), ``oom_retries`` and ``peak_co_residency`` (the most models on one device at once,
        replayed from the events: a shrunk model still holds its prefix, so it still counts)."""
        return _summary(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[OffloadEvent]:
        return iter(self.events)

    def __repr__(self) -> str:
        return _table(self.events, self.dropped)

    __str__ = __repr__


def _summary(events: Iterable[OffloadEvent]) -> dict[str, Any]:
    onloads = offloads = ooms = bytes_on = bytes_off = peak = 0
    resident: dict[str | None, set[str]] = {}
    for event in events:
        on_device = resident.setdefault(event.device, set())
        if event.action == "onload":
            onloads += 1
            bytes_on += event.model_size or 0
            on_device.add(event.model_id)
            peak = max(peak, len(on_device))
        elif event.action == "offload":
            offloads += 1
            bytes_off += event.model_size or 0
            if event.reason != "shrink":
                on_device.discard(event.model_id)
        else:
            ooms += 1
    return {
        "onloads": onloads,
        "offloads": offloads,
        "bytes_onloaded": bytes_on,
        "bytes_offloaded": bytes_off,
        "oom_retries": ooms,
        "peak_co_residency": peak,
    }


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {plural or word + 's'}"


def _table(events: deque[OffloadEvent], dropped: int) -> str:
    """One row per move as the peer prints it: an onload with the offloads that made room for it, then any
    other offload or out-of-memory on its own row; then the summary."""
    if not events:
        return "offload record: nothing recorded yet"
    sizes = {event.model_id: event.model_size for event in events if event.model_size is not None}

    def label(model_id: str) -> str:
        size = sizes.get(model_id)
        return model_id if size is None else f"{model_id} ({format_bytes(size)})"

    devices = len({event.device for event in events}) > 1
    rows = []
    for event in events:
        if event.reason is not None and event.reason.startswith("needed_by:"):
            continue  # on the row of the onload it made room for
        if event.action == "onload":
            offloaded = ", ".join(label(m) for m in event.offloaded) or "-"
            free = "-" if event.available_memory is None else format_bytes(event.available_memory)
            row = [label(event.model_id), offloaded, free, event.reason or ""]
        elif event.action == "offload":
            row = ["-", label(event.model_id), "-", event.reason or ""]
        else:
            row = ["-", "-", "-", f"out of memory: {event.model_id}"]
        rows.append([*((event.device or "-",) if devices else ()), *row])
    header = ["#", *(("device",) if devices else ()), "onload", "offloaded", "free before", "reason"]
    numbered = [[str(i), *row] for i, row in enumerate(rows, start=1)]
    widths = [max(len(cell) for cell in column) for column in zip(header, *numbered)]

    def line(cells: list[str]) -> str:
        return " | ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

    rule = "-" * (sum(widths) + 3 * (len(widths) - 1))
    lines = [line(header), rule]
    if dropped:
        lines.append(f"... {dropped} earlier events no longer held ...")
    lines += [line(row) for row in numbered]
    s = _summary(events)
    lines += [
        rule,
        f"{_plural(s['onloads'], 'onload')} ({format_bytes(s['bytes_onloaded'])}), "
        f"{_plural(s['offloads'], 'offload')} ({format_bytes(s['bytes_offloaded'])}), "
        f"{_plural(s['oom_retries'], 'out-of-memory retry', 'out-of-memory retries')}, "
        f"peak co-residency {s['peak_co_residency']}",
    ]
    return "\n".join(lines)
