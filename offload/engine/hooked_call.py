"""One hooked call of a model: counted as running, placed, run, retried once after running out of memory.

From the start of the call to its end the model counts as running in the calling thread (``offload.engine.calls``):
no other thread evicts it, and ``detach``/``close`` wait for it. At the end, the groups a streamed model
still holds are dropped, however the call ended, and what it streamed is logged (``offload.partial.beyond``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from offload.errors import OffloadOutOfMemoryError
from offload.records import messages

if TYPE_CHECKING:
    from offload.engine.engine import OffloadEngine

__all__ = ["run_forward"]


def run_forward(
    engine: OffloadEngine,
    model_id: str,
    forward: Callable,
    args: tuple,
    kwargs: dict,
    pre_forward: Callable[..., tuple[tuple, dict]] | None,
):
    """``OffloadEngine.run_forward``."""
    lock, calls, placer = engine._lock, engine._calls, engine._placer
    with lock:
        attached = calls.enter(model_id, engine.has_hook)
    if not attached:
        return forward(*args, **kwargs)
    try:
        # Without pre_forward, ``forward`` calls the hook's pre_forward itself (encode/decode).
        if pre_forward is not None:
            args, kwargs = pre_forward(*args, **kwargs)
            with lock:
                if not engine.is_resident(model_id):
                    # Evicted by hand (engine.evict) after the hook placed it.
                    with engine.host_tier.placing(model_id):
                        placer.place(model_id)
        try:
            return forward(*args, **kwargs)
        except torch.OutOfMemoryError as error:
            if not engine.retry_on_oom:  # the caller handles it (the peer's retry_on_oom=False)
                raise _out_of_memory(engine, model_id, retried=False) from error
            # else: leave the except block so the failed attempt's tensors can be freed
        with lock:
            placer.evict_all_but(model_id)
        try:
            return forward(*args, **kwargs)
        except torch.OutOfMemoryError as error:
            raise _out_of_memory(engine, model_id, retried=True) from error
    finally:
        with lock:
            calls.exit(model_id)
            # Drop and log the groups it streamed; once this thread's outermost call of the model ended, also
            # those its forwards still count as inside (a KeyboardInterrupt skips torch's always_call hooks).
            placer.beyond.end_call(model_id, thread_done=not calls.in_call()[model_id])


def _out_of_memory(engine: OffloadEngine, model_id: str, retried: bool) -> OffloadOutOfMemoryError:
    """The error of a forward that ran out of memory, with the sizes that decided it."""
    placer = engine._placer
    nbytes, (_, free) = engine.nbytes(model_id), placer.free_after_margin()
    return OffloadOutOfMemoryError(
        messages.forward_oom(model_id, nbytes, engine.probe.name, free, placer.margin, retried=retried)
    )
