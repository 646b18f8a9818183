"""A step callback's tensors in the classic pipelines' layout, for loops that keep guidance's halves apart.

The classic UNet pipelines (Stable Diffusion, SDXL) join each text condition into one classifier-free batch
before their loop, ``prompt_embeds = cat([negative_prompt_embeds, prompt_embeds])`` (SDXL likewise
``add_text_embeds`` and ``add_time_ids``), and hand that batch to ``callback_on_step_end``; once guidance is off
(a CFG cutoff callback sets ``pipeline._guidance_scale = 0.0`` and returns the last row), the loop runs on the
positive half alone. Our blocks hold the halves apart (the guider batches them per step), so a loop presents
each pair as the classic batch (``present``) and splits what a callback returns back into halves (``take``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import torch

__all__ = ["GuidanceBatch", "present", "take"]


@attrs.frozen
class GuidanceBatch:
    """A tensor the classic pipeline holds as one classifier-free batch, and the block-state halves it joins.

    Attributes:
        name: its name in ``callback_kwargs`` (the classic pipeline's local variable).
        positive: the block-state name of the conditional half.
        negative: the block-state name of the unconditional half.
    """

    name: str
    positive: str
    negative: str


def present(
    values: Mapping[str, Any],
    names: Iterable[str],
    batches: Iterable[GuidanceBatch],
    guided: bool,
    kept: dict[str, Any],
    loop_name: str,
) -> dict[str, Any]:
    """The ``callback_kwargs`` a step callback gets, as the classic pipeline's locals hold them.

    Args:
        values: the loop's block-state values.
        names: the tensors the callback asks for.
        batches: the loop's classifier-free batches: ``cat([negative, positive])`` while `guided`, the
            positive half alone once guidance is off.
        guided: whether classifier-free guidance is on for the call's next step.
        kept: values held aside for the call (``negative_prompt_embeds`` of classic Stable Diffusion, which its
            loop never reads after joining it into ``prompt_embeds``): filled at the first callback, then
            shown as the callbacks left them.
        loop_name: the loop's class name, for the error.

    Raises:
        ValueError: a tensor the loop has no value for in this call (an optional input not given).
    """
    by_name = {batch.name: batch for batch in batches}
    given: dict[str, Any] = {}
    for name in names:
        batch = by_name.get(name)
        if batch is not None:
            positive = values[batch.positive]
            negative = values.get(batch.negative)
            given[name] = torch.cat([negative, positive]) if guided and negative is not None else positive
        elif name in kept or name in values:
            given[name] = kept.setdefault(name, values[name]) if name in _KEPT else values[name]
        else:
            msg = (
                f"{loop_name}: the step callback asks for {name!r}, which this call's loop has no value for (an "
                f"optional input not given?); it has {sorted(values)}"
            )
            raise ValueError(msg)
    return given


#: Classic names whose value the classic loop never reads again (what a callback returns for them is kept and
#: shown to later callbacks, and changes nothing, as in the classic pipeline).
_KEPT = frozenset({"negative_prompt_embeds"})


def take(
    values: Mapping[str, Any],
    updates: Mapping[str, Any],
    batches: Iterable[GuidanceBatch],
    kept: dict[str, Any],
    loop_name: str,
) -> dict[str, Any]:
    """The block-state values that the tensors a callback returned stand for, to be set by the loop.

    A returned classifier-free batch of twice the positive half's rows is split into its halves (negative
    first); one of the positive half's rows is the positive half (the CFG cutoff callbacks' ``[-1:]``), the
    negative kept. A kept name (``negative_prompt_embeds``) is stored aside. Other names are taken as they are.

    Raises:
        ValueError: a returned batch of another number of rows (nothing is changed).
    """
    by_name = {batch.name: batch for batch in batches}
    changes: dict[str, Any] = {}
    for name, value in updates.items():
        batch = by_name.get(name)
        if name in _KEPT and batch is None:
            continue
        if batch is None:
            changes[name] = value
            continue
        rows = values[batch.positive].shape[0]
        count = value.shape[0] if isinstance(value, torch.Tensor) and value.dim() > 0 else None
        if count == 2 * rows:
            changes[batch.negative], changes[batch.positive] = value[:rows], value[rows:]
        elif count == rows:
            changes[batch.positive] = value
        else:
            msg = (
                f"{loop_name}: the step callback returned {name!r} with {count} rows; the loop takes {2 * rows} "
                f"(negative then positive, the classifier-free batch) or {rows} (the positive rows alone, as the "
                f"CFG cutoff callbacks return once they turn guidance off)"
            )
            raise ValueError(msg)
    for name in updates:
        if name in _KEPT and name not in by_name:
            kept[name] = updates[name]
    return changes
