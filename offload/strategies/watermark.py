"""A goal-based strategy: keep device use between a low and a high watermark, as a UI's memory manager does.

Use grows freely up to ``high``; the placement that would pass it evicts, in next-use order, until use
(the incoming model counted) is down to ``low``. The gap is headroom for work the engine does not see (a
UI's previews, another process), and evicting in one batch leaves room for the next models without asking
again at each. The cost is bytes: models evicted for headroom may be needed again (see
``benchmarks/offload_traces.py``).
"""

from __future__ import annotations

import attrs

from offload.devices.units import format_bytes, parse_bytes
from offload.strategies.lru import LRUStrategy
from offload.strategies.next_use import NextUseStrategy
from offload.strategies.strategy import OffloadRequest, OffloadStrategy

__all__ = ["WatermarkStrategy"]

Watermark = int | str | float


class WatermarkStrategy(OffloadStrategy):
    """Let device use grow to ``high`` without evicting; past it, evict until use is down to ``low``.

    The engine keeps free the larger of its ``memory_reserve_margin`` and the device's total less ``high``
    (through ``device_limit``), so it asks this strategy as soon as placing a model would take use past
    ``high``. Victims are then taken in ``NextUseStrategy``'s order (``LRUStrategy``'s when no plan was
    ever set) until use, the incoming model counted, is at most ``low``; when that cannot be reached every
    evictable model goes. Use counts every allocation on the device (other pipelines' models, other
    processes on a real card). A model larger than ``high`` is streamed by groups when it has them, as on
    a device of ``high`` bytes.

    Args:
        low: Use that evictions bring the device down to: bytes, a size such as ``"2GB"``, or a fraction of
            the device's total such as ``0.25``.
        high: Use the device may reach before anything is evicted; same forms; at most the device's total.

    Raises:
        TypeError: a watermark is not an int, str or float.
        ValueError: a watermark is not a size or a fraction in [0, 1], or ``low`` is not below ``high``
            (checked here when both are of one form, else when the strategy is given a device).

    Example:
        >>> WatermarkStrategy(low="2GB", high=0.75)
        WatermarkStrategy(low='2GB', high=0.75)
    """

    def __init__(self, low: Watermark, high: Watermark):
        self.low = _check_watermark(low, "low")
        self.high = _check_watermark(high, "high")
        # Both of one form: compare them now (a device's total only scales fractions, keeping their order).
        if isinstance(self.low, float) and isinstance(self.high, float):
            self._check_order(self.low, self.high, None)
        elif not isinstance(self.low, float) and not isinstance(self.high, float):
            self._check_order(parse_bytes(self.low), parse_bytes(self.high), None)

    def __repr__(self) -> str:
        return f"{self.name}(low={self.low!r}, high={self.high!r})"

    def resolve(self, total: int) -> tuple[int, int]:
        """The watermarks in bytes on a device of ``total`` bytes.

        Raises:
            ValueError: ``low`` is not below ``high``, or ``high`` is more than ``total`` (bytes given).
        """
        low, high = _bytes(self.low, total), _bytes(self.high, total)
        self._check_order(low, high, total)
        if high > total:
            msg = (
                f"WatermarkStrategy high ({_describe(self.high, total)}) is more than the device's total "
                f"({format_bytes(total)}). Give at most that, or a fraction of the device such as 0.75."
            )
            raise ValueError(msg)
        return low, high

    def _check_order(self, low: float, high: float, total: int | None) -> None:
        """Refuse ``low >= high``: bytes on a device of ``total`` bytes, or both of one form (``total`` None)."""
        if low >= high:
            msg = (
                f"WatermarkStrategy low ({_describe(self.low, total)}) must be below high "
                f"({_describe(self.high, total)}): use grows to high before anything is evicted, and evictions "
                "bring it down to low. Example: WatermarkStrategy(low='2GB', high='6GB')."
            )
            raise ValueError(msg)

    def device_limit(self, total: int) -> int:
        """The most bytes in use the device may reach before a placement asks this strategy: ``high``.

        Raises:
            ValueError: the watermarks do not fit a device of ``total`` bytes (see ``resolve``).
        """
        return self.resolve(total)[1]

    def select_victims(self, request: OffloadRequest) -> list[str]:
        """Victims in next-use (or LRU) order until use, ``request.model_id`` counted, is at most ``low``.

        A request without the device's use (``device_used`` None) gets only its shortfall freed.
        """
        aimed = request
        if request.device_total is not None and request.device_used is not None:
            low, _ = self.resolve(request.device_total)
            to_low = request.device_used + request.nbytes - low
            aimed = attrs.evolve(request, free=request.free - max(to_low - request.shortfall, 0))
        planned = request.upcoming or request.recent_plans
        order = NextUseStrategy() if planned else LRUStrategy()
        return order.select_victims(aimed)


def _check_watermark(value: object, which: str) -> int | str | float:
    """``value`` once it is known to be a size or a fraction (a string is kept as given, for the repr)."""
    if isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            msg = (
                f"WatermarkStrategy {which} as a fraction of the device's total must be in [0, 1] "
                f"(got {value!r}). Example: 0.75, or a size such as '6GB'."
            )
            raise ValueError(msg)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        msg = (
            f"WatermarkStrategy {which} must be bytes (an int), a size such as '6GB', or a fraction of the "
            f"device's total such as 0.75 (got {value!r} that is a {type(value)})."
        )
        raise TypeError(msg)
    parse_bytes(value, name=f"WatermarkStrategy {which}")
    return value


def _bytes(value: int | str | float, total: int) -> int:
    if isinstance(value, float):
        return int(value * total)
    return parse_bytes(value)


def _describe(value: int | str | float, total: int | None) -> str:
    """A watermark as given and, for a size string or a fraction of a device of ``total`` bytes, in bytes."""
    if isinstance(value, float):
        share = f"{value} of the device"
        return share if total is None else f"{share}: {format_bytes(_bytes(value, total))}"
    if isinstance(value, str):
        return f"{value!r}: {format_bytes(parse_bytes(value))}"
    return format_bytes(value)
