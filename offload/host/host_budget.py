"""The host budget: its default, from the host's memory, and its split between several devices.

The default budget is what the host has available when offload is turned on, less a margin. The host is
one memory, so ``enable_auto_cpu_offload(device=[...], host_budget=...)`` sets one budget for
the host copies of every engine. Each engine's host tier drops only its own models' copies, with its own
engine's lock held. A tier that dropped another engine's copies would need that engine's lock as well, and
two placements on two devices could then wait on each other; so the budget is split instead: each tier
holds a *share* in proportion to the bytes of the models its engine places. The shares add up to the
budget, and each tier keeps its copies within its share exactly as one device keeps them within the whole
budget, so the host copies of all of them stay within it.

The shares are recomputed when a model is attached or detached. A model larger than its new share with no
file to read it back from is refused before any share changes (``HostTier.check_fit``). A tier whose share
shrinks drops its least-needed copies at once, with only its own engine's lock held, one engine after the
other; no lock of another engine is ever taken while one is held.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs
import torch

from offload.devices.units import format_bytes, format_bytes_distinct
from offload.errors import HostBudgetError
from offload.host.spill_files import file_name_part
from offload.records.messages import reload_hint

if TYPE_CHECKING:
    from offload.host.disk_copies import FileGaps
    from offload.host.host_tier import HostTier

__all__ = ["HostShare", "SharedHostBudget", "default_host_budget", "host_memory", "spill_subfolders"]

#: Share of the host's total memory the default budget leaves to everything else.
HOST_MARGIN_SHARE = 0.1


def host_memory() -> tuple[int, int]:
    """The host's available and total memory in bytes (``MemAvailable`` where Linux reports it)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, total
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * page, total


def default_host_budget(held: int) -> int:
    """What the host can give host copies: what it has available, plus the ``held`` bytes of host copies
    already in memory, minus ``HOST_MARGIN_SHARE`` of its total memory."""
    available, total = host_memory()
    return max(available + held - int(total * HOST_MARGIN_SHARE), 0)


@attrs.frozen
class HostShare:
    """One device's share of a host budget that several devices split.

    Attributes:
        budget: The whole host budget, in bytes.
        device: The name of the device whose engine holds the share.
        placed: Bytes of the models that engine places (those with a host copy under the budget).
        total: Bytes of the models every engine places.
        devices: How many devices split the budget.
    """

    budget: int
    device: str
    placed: int
    total: int
    devices: int

    @property
    def nbytes(self) -> int:
        """The bytes of host copies the share holds: ``budget * placed / total`` (an even split while no
        engine places anything)."""
        if self.total == 0:
            return self.budget // self.devices
        return self.budget * self.placed // self.total

    def budget_holding(self, size: int) -> int:
        """The least host budget whose share, the models placed as now, holds ``size`` bytes."""
        return -(-size * self.total // max(self.placed, 1))

    def refusal(self, model_id: str, size: int, gaps: FileGaps) -> str:
        """Why ``model_id`` (``size`` bytes, larger than the share) cannot go under it, and the fix."""
        need, share, budget = format_bytes_distinct(size, self.nbytes, self.budget)
        placed = format_bytes(self.placed)
        return (
            f"model {model_id!r} ({need}) is larger than {self.device}'s share {share} of host_budget {budget} "
            f"(split between the {self.devices} devices by the bytes of the models each places; {self.device} "
            f"places {placed}) and has {gaps.where} of its weights to read back from ({gaps.missing}); it "
            f"would have to be held in host memory beyond the share. Raise host_budget to at least "
            f"{format_bytes(self.budget_holding(size))}, {reload_hint(gaps.quantized)}. Nothing was dropped."
        )


class SharedHostBudget:
    """``budget`` bytes of host copies split between the host tiers of several engines, one per device.

    Not thread safe on its own: the caller (the manager's offload link) holds the manager's lock. Each tier
    is read and changed with its own engine's lock held, one tier at a time (``HostTier.set_share``).

    Args:
        budget: The whole host budget in bytes.
        tiers: The engines' host tiers, in the order of the device list.
        names: The devices' names, in the same order.
    """

    def __init__(self, budget: int, tiers: Sequence[HostTier], names: Sequence[str]):
        self.budget = budget
        self._tiers = list(tiers)
        self._names = list(names)

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}: {format_bytes(t.budget)}" for n, t in zip(self._names, self._tiers))
        return f"SharedHostBudget({format_bytes(self.budget)}; {shares})"

    def shares(self, added: Mapping[int, int] | None = None) -> list[HostShare]:
        """Each tier's share with the models placed now, plus ``added`` bytes (by tier index) to be placed."""
        added = added or {}
        placed = [tier.placed_bytes() + added.get(i, 0) for i, tier in enumerate(self._tiers)]
        return [
            HostShare(self.budget, name, mine, sum(placed), len(placed))
            for name, mine in zip(self._names, placed)
        ]

    def check(
        self,
        shares: Sequence[HostShare],
        modules: Mapping[int, Mapping[str, torch.nn.Module]] | None = None,
        files: Mapping[int, Mapping[str, Sequence[str]]] | None = None,
    ) -> None:
        """Raise HostBudgetError if a model, placed now or in ``modules`` (by tier index) to be attached,
        is larger than its tier's share in ``shares`` and has no file to read it back from."""
        for index, (tier, share) in enumerate(zip(self._tiers, shares)):
            tier.check_share(share, (modules or {}).get(index, {}), (files or {}).get(index, {}))

    def start(self, shares: Sequence[HostShare]) -> None:
        """Give each tier its first share, before any model is attached (nothing to drop)."""
        for tier, share in zip(self._tiers, shares):
            tier.set_share(share, drop=False)

    @contextmanager
    def attaching(
        self,
        index: int,
        placed: int,
        modules: Mapping[str, torch.nn.Module],
        files: Mapping[str, Sequence[str]],
    ) -> Iterator[None]:
        """Around attaching ``modules`` (``placed`` bytes of host copies) to tier ``index``'s engine.

        The new shares are checked first (HostBudgetError, nothing changed). Tier ``index``'s share grows (it
        places more of the total): it is set before, so the engine's own check sees it. The others shrink:
        they are set after, each tier dropping copies to fit. If the body raises, the shares stay as they were.
        """
        shares = self.shares({index: placed})
        self.check(shares, {index: modules}, {index: files})
        tier, previous = self._tiers[index], self._tiers[index].share
        tier.set_share(shares[index], drop=False)
        try:
            yield
        except BaseException:
            if previous is not None:
                tier.set_share(previous, drop=False)
            raise
        for other, share in zip(self._tiers, shares):
            if other is not tier:
                other.set_share(share)

    def rebalance(self) -> None:
        """After a model left: give every tier its new share (dropping copies where it shrank), unless a model
        would then be larger than its tier's share with no file to read it back from; then keep them all."""
        shares = self.shares()
        try:
            self.check(shares)
        except HostBudgetError:
            return  # the shares in force still add up to the budget: the host copies stay within it
        for tier, share in zip(self._tiers, shares):
            tier.set_share(share)


def spill_subfolders(folder: str | os.PathLike | None, names: Sequence[str]) -> list[str | None]:
    """One subfolder of ``folder`` per device (``0-cuda_0``, ``1-cuda_1``), so their spill files never meet;
    ``None`` for each when ``folder`` is ``None`` (each tier then makes a temporary folder of its own)."""
    if folder is None:
        return [None] * len(names)
    # The index keeps two names that read alike once cleaned ("a:b", "a_b") in two folders.
    return [
        os.path.join(os.fspath(folder), f"{index}-{file_name_part(name)}") for index, name in enumerate(names)
    ]
