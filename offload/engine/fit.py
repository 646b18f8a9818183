"""Fit checks made before anything moves: models at enable, a pinned model at attach, the models of a plan.

A model fits when it can be on the device alone, every other placed model evicted, after the margin or, if
more, what the strategy keeps free (a ``device_limit`` such as ``WatermarkStrategy``'s high watermark: the
placer never lets use pass it); one that does not may still stream group by group (``offload.partial.beyond``).
Pinned models (``offload.weights.pinned``) never leave, so the room they hold is not there for the others.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from offload.devices.storage import module_nbytes
from offload.devices.units import format_bytes
from offload.errors import ModelTooLargeError
from offload.records import messages
from offload.strategies.strategy import SupportsSelectVictims, strategy_name
from offload.weights.pinned import is_marked_pinned, pinned_device_bytes, pinned_too_large

if TYPE_CHECKING:
    from offload.engine.placement import Placer
    from offload.host.host_tier import HostTier

__all__ = ["check_fit", "check_pinned_attach", "check_plan_fit", "set_strategy_if_fit", "unfit_error"]


def unfit_error(
    placer: Placer, sizes: dict[str, int], capacity: int, intro: str, after: str
) -> ModelTooLargeError:
    """The error for models that cannot fit ``capacity`` even alone."""
    device = messages.device_name(placer._probe)
    return ModelTooLargeError(messages.unfit(sizes, capacity, device, placer.margin, intro, after))


def _beside(pinned: Mapping[str, int]) -> str:
    return f" beside the pinned {', '.join(repr(m) for m in pinned)}" if pinned else ""


def _kept_free(placer: Placer) -> tuple[int, str]:
    """Bytes the placer keeps free: the margin, or what the strategy's ``device_limit`` leaves if more; and
    when the strategy decides it, the sentence that says so (added to the messages)."""
    held = placer._held_free  # total - device_limit(total), set with the strategy
    if held <= placer.margin:
        return placer.margin, ""
    total = placer._total()
    limit, total_text = format_bytes(total - held), format_bytes(total)
    note = (
        f" The strategy {placer.strategy!r} lets use reach at most {limit} of the device's {total_text} (its "
        f"device_limit): give {strategy_name(placer.strategy)} a higher limit, or use a larger device."
    )
    return held, note


def check_fit(
    placer: Placer,
    host: HostTier,
    modules: Mapping[str, torch.nn.Module],
    after: str,
    weight_files: Mapping[str, Sequence[str]],
    pinned: Collection[str],
) -> None:
    """``OffloadEngine.check_fit``; call with the engine's lock held.

    The pinned models among ``modules`` (named in ``pinned``, or marked) must fit the device less what is
    kept free and the pinned models already attached; the others must then fit alone in what is left, or
    stream.
    """
    probe, ledger = placer._probe, placer._ledger
    if probe.always_resident:
        return
    new_pinned = {
        m: pinned_device_bytes(probe, module)
        for m, module in modules.items()
        if m in pinned or is_marked_pinned(module)
    }
    others = {m: module for m, module in modules.items() if m not in new_pinned}
    host.check_fit(others, weight_files)
    kept, note = _kept_free(placer)
    total = probe.total_bytes()
    if total is None:  # what can be made free now; a real device already sees the new pinned models' bytes
        room = placer.capacity_alone() + placer.margin - kept
        room += sum(new_pinned.values()) if probe.moves_weights else 0
    else:
        room = total - kept - sum(n for m, n in ledger.pinned().items() if m not in modules)
    if new_pinned and sum(new_pinned.values()) > room:
        device = messages.device_name(probe)
        raise ModelTooLargeError(pinned_too_large(new_pinned, room, device, placer.margin, note + after))
    capacity = room - sum(new_pinned.values())
    too_large = {model_id: m for model_id, m in others.items() if module_nbytes(m) > capacity}
    unfit, problems = placer.beyond.unstreamable(too_large, capacity)  # the others stream
    if unfit:
        all_pinned = {**ledger.pinned(), **new_pinned}
        raise unfit_error(placer, unfit, capacity, "{models} cannot fit" + _beside(all_pinned), note + after)
    if problems:
        raise ModelTooLargeError(" ".join(problems) + note + after)


def check_pinned_attach(placer: Placer, model_id: str, module: torch.nn.Module) -> None:
    """Raise ModelTooLargeError if pinning ``module`` leaves it no room even with every placed model evicted;
    call with the engine's lock held."""
    probe = placer._probe
    if probe.always_resident:
        return
    held = pinned_device_bytes(probe, module)
    kept, note = _kept_free(placer)
    room = placer.capacity_alone() + placer.margin - kept
    room += held if probe.moves_weights else 0  # a real device sees it already
    if held > room:
        device = messages.device_name(probe)
        after = f"{note} {model_id!r} was not attached."
        raise ModelTooLargeError(pinned_too_large({model_id: held}, room, device, placer.margin, after))


def _check_alone(placer: Placer, model_ids: Sequence[str], what: str, intro: str, after: str) -> None:
    """Raise ModelTooLargeError, ``what`` first, if one of ``model_ids`` cannot fit even alone (nor stream)."""
    ledger = placer._ledger
    kept, note = _kept_free(placer)
    capacity = placer.capacity_alone() + placer.margin - kept
    too_large = {
        m: ledger.module(m) for m in model_ids if not ledger.is_pinned(m) and ledger.nbytes(m) > capacity
    }
    unfit, problems = placer.beyond.unstreamable(too_large, capacity)  # the others stream
    if unfit:
        intro = f"{what}: {intro}" + _beside(ledger.pinned())
        raise unfit_error(placer, unfit, capacity, intro, note + after)
    if problems:
        raise ModelTooLargeError(f"{what}: {' '.join(problems)}{note}{after}")


def check_plan_fit(placer: Placer, planned: Sequence[str]) -> None:
    """Raise ModelTooLargeError if a model of a plan cannot fit even alone (nor stream); pinned models stay
    where they are and are left out. Call with the engine's lock held."""
    _check_alone(
        placer, planned, "set_plan", "the call would use {models}, which cannot fit", " Nothing was moved."
    )


def set_strategy_if_fit(placer: Placer, strategy: SupportsSelectVictims) -> None:
    """Give ``placer`` the ``strategy``, unless an attached model could not fit even alone (nor stream) under
    the device limit it sets: then ModelTooLargeError, the previous strategy kept. Call with the engine's
    lock held."""
    previous, placer.strategy = placer.strategy, strategy  # the setter asks its device_limit first
    try:
        after = " The strategy was not changed."
        _check_alone(
            placer, placer._ledger.ids(), f"set_strategy({strategy!r})", "{models} could not fit", after
        )
    except ModelTooLargeError:
        placer.strategy = previous
        raise
