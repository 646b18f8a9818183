"""The strategy protocol: given a request, the residents, the free bytes and the plan, name the victims.

A strategy is any object with ``select_victims(request) -> Sequence[str]``; subclass
``OffloadStrategy`` for a name and a repr. A strategy written for diffusers' ``ComponentsManager`` (a
callable taking the hooks, the model id, the model and the execution device) runs through
``offload/strategies/peer_strategy.py``. The engine calls it only when the requested model does not
fit in the free bytes (after the margin), and checks the answer: every victim must be one of
``request.residents``, and together they must free at least ``request.shortfall`` bytes.

A strategy may also have ``device_limit(total) -> int``: the most bytes of a device of ``total`` bytes it lets
be in use before it is asked (``offload/strategies/watermark.py``). The engine calls it when the strategy is set (a
ValueError there refuses the device, nothing changed) and keeps free the larger of its margin and
``total - device_limit(total)``, so a model that would take use past the limit is a request too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, cast

import attrs

__all__ = [
    "OffloadRequest",
    "OffloadStrategy",
    "SupportsSelectVictims",
    "check_strategy",
    "strategy_name",
    "take_until_enough",
]


@attrs.frozen
class OffloadRequest:
    """What a strategy sees when a model must be made resident and does not fit.

    Attributes:
        model_id: The model asked for.
        nbytes: Its size in bytes.
        free: Free device bytes after the engine's memory reserve margin.
        residents: Resident models that may be evicted, with their sizes in bytes, least recently used
            first (models in the middle of a forward are left out).
        upcoming: The rest of the running pipeline call's model uses after this one, nearest first (a
            loop body once more when inside a loop); empty when no plan is set.
        recent_plans: The plans of recent pipeline calls, oldest first; the running one is last.
            What was run recently is the best guess of what runs next.
        last_used: Logical time of each resident's last use (higher is more recent).
        device_total: The device's total bytes, when the request is for room on a device (None otherwise).
        device_used: Bytes in use on that device now, every allocation counted (None when not known).
    """

    model_id: str
    nbytes: int
    free: int
    residents: Mapping[str, int]
    upcoming: tuple[str, ...] = ()
    recent_plans: tuple[tuple[str, ...], ...] = ()
    last_used: Mapping[str, int] = attrs.field(factory=dict)
    device_total: int | None = None
    device_used: int | None = None

    @property
    def shortfall(self) -> int:
        """Bytes the victims must free together."""
        return self.nbytes - self.free


class SupportsSelectVictims(Protocol):
    """What the engine needs of a strategy (for the type checker; the engine checks it at run time)."""

    def select_victims(self, request: OffloadRequest) -> Sequence[str]: ...


def check_strategy(strategy: object) -> SupportsSelectVictims:
    """Return ``strategy`` once it is known to have a ``select_victims`` method.

    Raises:
        TypeError: it has none (the message names the strategies that ship).
    """
    if not callable(getattr(strategy, "select_victims", None)):
        msg = (
            f"offload strategy must have a select_victims(request) method (got {strategy!r} that is a "
            f"{type(strategy)}). Subclass offload.OffloadStrategy, use NextUseStrategy(), "
            "SmallestSufficientSet() or LRUStrategy(), or pass a strategy written for diffusers' "
            "ComponentsManager: a callable (hooks, model_id, model, execution_device) -> hooks to offload."
        )
        raise TypeError(msg)
    return cast(SupportsSelectVictims, strategy)  # checked just above


def strategy_name(strategy: object) -> str:
    """The name a strategy shows in logs and reports: its ``name``, else its class's name."""
    name = getattr(strategy, "name", None)
    return name if isinstance(name, str) else type(strategy).__name__


class OffloadStrategy:
    """Base class of strategies. Override ``select_victims``."""

    @property
    def name(self) -> str:
        """Name shown in the offload log."""
        return type(self).__name__

    def __repr__(self) -> str:
        return f"{self.name}()"

    def select_victims(self, request: OffloadRequest) -> Sequence[str]:
        """Return the resident model ids to evict so that ``request.model_id`` fits.

        Args:
            request: The request, residents, free bytes and plan.

        Returns:
            Ids from ``request.residents`` whose sizes add up to at least ``request.shortfall``.
        """
        raise NotImplementedError


def take_until_enough(
    order: Sequence[str], sizes: Mapping[str, int], shortfall: int, trim: bool
) -> list[str]:
    """Take ids from ``order`` (most evictable first) until their sizes reach ``shortfall``.

    With ``trim``, then give back every taken model, most valuable first, whose eviction turns out
    unnecessary because the others already free enough (a small model taken before a big one).
    """
    taken: list[str] = []
    freed = 0
    for model_id in order:
        if freed >= shortfall:
            break
        taken.append(model_id)
        freed += sizes[model_id]
    if trim:
        for model_id in reversed(taken[:-1]):
            if freed - sizes[model_id] >= shortfall:
                taken.remove(model_id)
                freed -= sizes[model_id]
    return taken
