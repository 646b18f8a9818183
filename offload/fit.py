"""Fit checks made before anything moves: models at enable, a pinned model at attach, the models of a plan.

A model fits when it can be on the device alone, every other placed model evicted, after the margin; one
that does not may still stream group by group (``offload.partial``). Pinned models (``offload.pinned``)
never leave, so the room they hold is not there for the others.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from offload import messages
from offload.errors import ModelTooLargeError
from offload.pinned import is_marked_pinned, pinned_device_bytes, pinned_too_large
from offload.storage import module_nbytes

if TYPE_CHECKING:
    from offload.host_tier import HostTier
    from offload.placement import Placer

__all__ = ["check_fit", "check_pinned_attach", "check_plan_fit", "unfit_error"]


def unfit_error(
    placer: Placer, sizes: dict[str, int], capacity: int, intro: str, after: str
) -> ModelTooLargeError:
    """The error for models that cannot fit ``capacity`` even alone."""
    device = messages.device_name(placer._probe)
    return ModelTooLargeError(messages.unfit(sizes, capacity, device, placer.margin, intro, after))


def _beside(pinned: Mapping[str, int]) -> str:
    return f" beside the pinned {', '.join(repr(m) for m in pinned)}" if pinned else ""


def check_fit(
    placer: Placer,
    host: HostTier,
    modules: Mapping[str, torch.nn.Module],
    after: str,
    weight_files: Mapping[str, Sequence[str]],
    pinned: Collection[str],
) -> None:
    """``OffloadEngine.check_fit``; call with the engine's lock held.

    The pinned models among ``modules`` (named in ``pinned``, or marked) must fit the device less the margin
    and the pinned models already attached; the others must then fit alone in what is left, or stream.
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
    total = probe.total_bytes()
    if total is None:  # what can be made free now; a real device already sees the new pinned models' bytes
        room = placer.capacity_alone() + (sum(new_pinned.values()) if probe.moves_weights else 0)
    else:
        room = total - placer.margin - sum(n for m, n in ledger.pinned().items() if m not in modules)
    if sum(new_pinned.values()) > room:
        device = messages.device_name(probe)
        raise ModelTooLargeError(pinned_too_large(new_pinned, room, device, placer.margin, after))
    capacity = room - sum(new_pinned.values())
    too_large = {model_id: m for model_id, m in others.items() if module_nbytes(m) > capacity}
    unfit, problems = placer.beyond.unstreamable(too_large, capacity)  # the others stream
    if unfit:
        all_pinned = {**ledger.pinned(), **new_pinned}
        raise unfit_error(placer, unfit, capacity, "{models} cannot fit" + _beside(all_pinned), after)
    if problems:
        raise ModelTooLargeError(" ".join(problems) + after)


def check_pinned_attach(placer: Placer, model_id: str, module: torch.nn.Module) -> None:
    """Raise ModelTooLargeError if pinning ``module`` leaves it no room even with every placed model evicted;
    call with the engine's lock held."""
    probe = placer._probe
    if probe.always_resident:
        return
    held = pinned_device_bytes(probe, module)
    room = placer.capacity_alone() + (held if probe.moves_weights else 0)  # a real device sees it already
    if held > room:
        device = messages.device_name(probe)
        after = f" {model_id!r} was not attached."
        raise ModelTooLargeError(pinned_too_large({model_id: held}, room, device, placer.margin, after))


def check_plan_fit(placer: Placer, planned: Sequence[str]) -> None:
    """Raise ModelTooLargeError if a model of a plan cannot fit even alone (nor stream); pinned models stay
    where they are and are left out. Call with the engine's lock held."""
    ledger = placer._ledger
    capacity = placer.capacity_alone()
    too_large = {
        m: ledger.module(m) for m in planned if not ledger.is_pinned(m) and ledger.nbytes(m) > capacity
    }
    unfit, problems = placer.beyond.unstreamable(too_large, capacity)  # the others stream
    if unfit:
        intro = "set_plan: the call would use {models}, which cannot fit" + _beside(ledger.pinned())
        raise unfit_error(placer, unfit, capacity, intro, " Nothing was moved.")
    if problems:
        raise ModelTooLargeError(f"set_plan: {' '.join(problems)} Nothing was moved.")
