"""Shrinking a victim to a resident prefix instead of evicting it whole.

When a model needs room and the victims the strategy picked free more than it needs, the surplus would
sit empty. A victim needed again (later in this call, or by a plan run recently) keeps instead the longest
prefix of its groups (``offload.partial.groups``: the base group, then its blocks in order) that fits the
surplus; only its tail leaves the device (the host copy is kept: zero bytes copied back). At its next use
only the tail moves in when room allows; otherwise the prefix leaves too and the model is placed as any
other. Decided by bytes moved: keeping ``p`` bytes saves ``p`` bytes at the victim's next use and moves
none now (the prefix holds room nobody asked for, and a later placement evicts it for free), so a victim
no plan needs again, or whose smallest prefix does not fit the surplus, is evicted whole. A victim needed
again before the model placed for it runs again is evicted whole too: the two alternate, and streaming
(``offload.partial.beyond``) is what moves fewer bytes there.

Across calls two models may alternate the same way: a repeated workflow whose two models do not fit
together shrinks each in turn to bring the other's tail back, moving both tails every call, where whole
eviction would have streamed one of them (and kept the other whole). So when a shrunk model's tail
needs evictions, ``tail_or_stream`` prices both over the plan's remaining uses; when streaming moves
fewer bytes, its prefix leaves and it is placed as any other model, and streams
(``tests/offload/test_shrink.py``, the ping-pong trace).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from offload.devices.units import format_bytes
from offload.partial.groups import split_groups
from offload.partial.streaming import best_layout
from offload.weights.ledger import ResidencyLedger

if TYPE_CHECKING:
    from offload.engine.placement import Placer

__all__ = ["shrink_victims", "shrunk_prefix", "tail_or_stream"]

# The engine's logger name, which users filter on; shrinking is part of placement.
logger = logging.getLogger("offload.engine.engine")


def shrunk_prefix(ledger: ResidencyLedger, model_id: str) -> int | None:
    """Bytes of ``model_id``'s resident prefix if it was shrunk (its tail off the device, no room held for
    streaming it), else None: the ledger's answer (``ResidencyLedger.shrunk_prefix``), which it also acts on."""
    return ledger.shrunk_prefix(model_id)


def _needed_again(placer: Placer, model_id: str, victim: str) -> tuple[int, int] | None:
    """How soon ``victim`` is needed (lower is sooner): by its place in the running plan, else by how many
    recent plans used it; None when no plan needs it again (keeping a prefix would save nothing)."""
    upcoming = list(placer.plan.upcoming(model_id)) if placer.plan else []
    if victim in upcoming:
        own_next = upcoming.index(model_id) if model_id in upcoming else len(upcoming)
        again = placer.beyond.remaining_uses(model_id, upcoming, now=1) > 1
        if upcoming.index(victim) < own_next and again:
            # Back before this model's next use in this call: they alternate (a loop), and its tail would
            # evict this model in turn at every step; streaming (offload.partial.beyond) moves fewer bytes there.
            return None
        return 0, upcoming.index(victim)
    recent = sum(victim in plan for plan in placer._recent_plans)
    return (1, -recent) if recent else None


def shrink_victims(placer: Placer, model_id: str, victims: Sequence[str], surplus: int) -> list[str]:
    """Shrink the victims of ``model_id``'s placement that are worth keeping a prefix of, within ``surplus``
    (the bytes the victims free beyond what ``model_id`` needs); log each (reason ``shrink``). Returns the
    victims left to evict whole."""
    ledger = placer._ledger
    ranked = []
    for victim in victims:
        soon = _needed_again(placer, model_id, victim)
        if soon is not None and ledger.partial(victim) is None and not placer._probe.always_resident:
            ranked.append((soon, victim))
    whole = list(victims)
    for _, victim in sorted(ranked):
        groups = split_groups(ledger.module(victim))
        if len(groups) < 2 or sum(g.nbytes for g in groups) != ledger.nbytes(victim):
            continue  # nothing to split, or groups that do not account for every byte: evicted whole
        keep, prefix = 0, 0
        while keep < len(groups) - 1 and prefix + groups[keep].nbytes <= surplus:
            prefix += groups[keep].nbytes
            keep += 1
        if keep == 0 or prefix == 0:
            continue  # its base group alone exceeds the surplus, or nothing worth keeping fits
        free_before = placer._probe.free_bytes()
        tail = [owner for group in groups[keep:] for owner in group.owners]
        streamer = placer.beyond._streamers.get(victim)
        if streamer is not None:
            streamer.layout = None  # its stream hooks stay idle while it is shrunk
        to_host = ledger.drop_tail(victim, tail, prefix)
        placer.record(victim, (), 0, to_host, free_before, "shrink")
        kept, of = format_bytes(prefix), format_bytes(ledger.nbytes(victim))
        logger.info("shrink: kept %s of %s (%s) resident to make room for %s", kept, victim, of, model_id)
        surplus -= prefix
        whole.remove(victim)
    return whole


def tail_or_stream(placer: Placer, model_id: str, tail: int, free: int, evictable: Mapping[str, int]) -> bool:
    """Whether shrunk ``model_id`` should drop its prefix and stream rather than evict others for its
    ``tail`` bytes (``free``: bytes free after the margin; ``evictable``: the residents not running).

    True only when placing it afresh would stream (the choice ``offload.partial.beyond`` makes, replayed here
    without moving anything) and that moves fewer bytes over the plan: its streamed bytes at each
    remaining use, against its tail plus each victim of the tail that this call needs again, times that
    victim's remaining uses. The streamed layout's prefix is uploaded again once; it is left out, as
    ``offload.partial.beyond`` leaves it out, because in a repeated workflow it is paid once while evicting for
    the tail is paid every call (counting it kept the ping-pong of ``tests/offload/test_shrink.py``).
    """
    beyond, ledger = placer.beyond, placer._ledger
    prefix = shrunk_prefix(ledger, model_id) or 0
    nbytes, room = ledger.nbytes(model_id), free + prefix  # as if its prefix had left
    if nbytes > room + sum(evictable.values()):
        return False  # placed afresh it would wait for running models, not stream
    upcoming = tuple(placer.plan.upcoming(model_id)) if placer.plan else ()
    spare = sum(size for m, size in evictable.items() if m not in upcoming)
    groups = beyond.streamer(model_id).groups
    capacity = free + sum(ledger.residents().values())  # every model evicted, its prefix too
    layout = best_layout(groups, room + spare, beyond.slots_for(model_id, groups, capacity))
    if layout is None or layout.whole:
        return False
    if not beyond._streaming_is_cheaper(model_id, nbytes, room, evictable, upcoming, layout):
        return False
    uses = beyond.remaining_uses(model_id, upcoming, now=1)
    request = placer.request(model_id, tail, free, dict(evictable))
    victims = set(placer.strategy.select_victims(request)) & set(upcoming)
    evicting = tail + sum(evictable.get(v, 0) * beyond.remaining_uses(v, upcoming) for v in victims)
    return layout.streamed_bytes * uses < evicting
