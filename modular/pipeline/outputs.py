"""What a call hands back: the state, one value or a dict, with tensors the caller may change in place.

A call runs under ``torch.inference_mode()``, whose tensors cannot be changed in place (``image.mul_(2)``)
or used in autograd outside it. Classic and peer pipelines run under ``torch.no_grad()`` and return ordinary
tensors, so ours are cloned here, once, outside inference mode. Measured against running under no_grad
(``benchmarks/overhead.py --run grad``, tiny SD on the CPU): no_grad costs 3-5% per call, these clones
under 1.5%.
"""

from __future__ import annotations

from typing import Any

import torch

from modular.framework.state import PipelineState

__all__ = ["call_result", "changeable"]


def call_result(state: PipelineState, output: str | list[str] | None) -> Any:
    """``state`` (``output=None``), its value ``output`` (a name) or a dict of values (a list of names),
    with every tensor made in inference mode cloned into an ordinary one."""
    if output is None:
        state.values = changeable(state.values)
        return state
    if isinstance(output, str):
        return changeable(state.get(output))
    return changeable({name: state.get(name) for name in output})


def changeable(value: Any, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """``value`` with each inference tensor in it (also inside lists, tuples and dicts) replaced by a clone.

    Everything else (ordinary tensors a caller passed in, images, generators, and containers with no
    inference tensor in them) is returned as it is. One tensor found twice becomes one clone, so values that
    were the same object still are.
    """
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        if not value.is_inference():
            return value
        if id(value) not in memo:
            memo[id(value)] = value.clone()
        return memo[id(value)]
    if isinstance(value, dict):
        changed = {key: changeable(item, memo) for key, item in value.items()}
        return value if all(changed[key] is item for key, item in value.items()) else changed
    if isinstance(value, list | tuple):
        items = [changeable(item, memo) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple
    return value
