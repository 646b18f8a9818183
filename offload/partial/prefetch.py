"""Prefetch: moving the next model in while the current one computes.

From the plan, the engine knows which model runs next. When that one is off the device and room can be
made without evicting anything needed sooner than it, it is uploaded ahead: on CUDA on a side stream
(``CopyStream``) from the pinned host copy, and its forward waits on an event (on the GPU, not the
host) only if the copy is still running. Streamed groups prefetch the next group the same way
(``offload.partial.streaming``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch

__all__ = ["CopyStream", "next_model", "prefetch_victims"]

T = TypeVar("T")


class CopyStream:
    """A CUDA side stream for host-to-device copies that overlap the forward in progress.

    Args:
        device: The CUDA device.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._stream = torch.cuda.Stream(device)

    def run(self, copy: Callable[[], T]) -> tuple[T, torch.cuda.Event]:
        """Run ``copy`` (which queues non-blocking copies) on the side stream; returns its result and an
        event recorded after it."""
        with torch.cuda.stream(self._stream):
            result = copy()
            event = torch.cuda.Event()
            event.record(self._stream)
        return result, event

    def wait(self, event: object, tensors: Sequence[torch.Tensor]) -> None:
        """Make the compute stream wait for ``event`` (on the GPU), and tell the allocator that
        ``tensors``, allocated on the side stream, are used on the compute stream (so their memory is not
        reused by a later copy before the forwards that read them are done)."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)  # type: ignore[arg-type]  # a torch.cuda.Event from run()
        for tensor in tensors:
            if tensor.device.type == "cuda":
                tensor.record_stream(current)


def next_model(model_id: str, upcoming: Sequence[str]) -> str | None:
    """The first model other than ``model_id`` in ``upcoming``, or None."""
    return next((m for m in upcoming if m != model_id), None)


def prefetch_victims(
    target: str, shortfall: int, evictable: Mapping[str, int], upcoming: Sequence[str]
) -> list[str] | None:
    """Models to evict so that ``target`` fits, all needed later than it (or not at all), furthest first.

    None when those cannot free ``shortfall`` bytes: prefetch never evicts a model needed sooner.
    """
    first: dict[str, int] = {}
    for position, model_id in enumerate(upcoming):
        first.setdefault(model_id, position)
    due = first.get(target, len(upcoming))
    later = [m for m in evictable if first.get(m, len(upcoming) + 1) > due]
    later.sort(key=lambda m: first.get(m, len(upcoming) + 1), reverse=True)
    victims: list[str] = []
    freed = 0
    for model_id in later:
        if freed >= shortfall:
            break
        victims.append(model_id)
        freed += evictable[model_id]
    return victims if freed >= shortfall else None
