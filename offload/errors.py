"""Errors raised by the offload engine. Each subclasses a built-in so callers can catch the usual kind."""

from __future__ import annotations

import torch

__all__ = [
    "DeviceMoveError",
    "DiskCopyError",
    "HostBudgetError",
    "ModelTooLargeError",
    "OffloadDeadlockError",
    "OffloadOutOfMemoryError",
    "OffloadTimeoutError",
    "StrategyError",
]


class ModelTooLargeError(ValueError):
    """A model cannot fit on the device even with every other model evicted. Raised before anything moves."""


class OffloadOutOfMemoryError(MemoryError, torch.OutOfMemoryError):
    """A forward ran out of device memory, and did again after every other model was evicted (or once, with
    ``retry_on_oom=False``). Also a ``torch.OutOfMemoryError``, so code written for the peer, which re-raises
    torch's own error, catches it as it is."""


class OffloadTimeoutError(TimeoutError):
    """A call waited longer than the engine's ``wait_timeout`` for models running in other threads."""


class OffloadDeadlockError(RuntimeError):
    """Threads wait for room that only each other's running models can free: no waiting can end it."""


class StrategyError(ValueError):
    """A strategy returned victims that are not resident, include the requested model, or free too little."""


class HostBudgetError(ValueError):
    """``host_budget`` or ``spill_folder`` cannot be honoured (a model the budget cannot hold has no file to
    read back from, or the spill folder is not writable). Raised before anything is dropped."""


class DiskCopyError(RuntimeError):
    """A model whose host copy was dropped cannot be read back: a file it reads is gone or was replaced."""


class DeviceMoveError(ValueError):
    """A ``.to(device)`` by hand of a model auto offload places, which would move its weights behind the
    engine's back (``offload/engine/conversions.py``). Raised before anything moves."""
