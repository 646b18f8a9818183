"""A count of registrations into attached models, so that a model's structure is re-read only after one.

Adding a LoRA (peft injects new submodules with ``setattr``), swapping a submodule or assigning a new
parameter or buffer all go through ``torch.nn.Module``'s registration, which calls the global hooks
installed here. The hooks count only registrations into *watched* modules (the submodules of attached
models), so modules built elsewhere, or the throwaway ``ModuleList`` a diffusers UNet makes with
``self.resnets[1:]`` at every step, leave the count alone. Checking whether a model may have changed
is then one integer comparison; only when the count moved is the model walked
(``offload.storage.module_fingerprint``).
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterable

import torch
from torch.nn.modules import module as torch_module

__all__ = ["install_registration_counter", "registrations", "unwatch", "watch"]

_counter = itertools.count(1)
_latest = 0
_watched: Counter[int] = Counter()  # id(module) -> how many ledger entries watch it
_lock = threading.Lock()
_installed = False


def _count_registration(module: torch.nn.Module, name: str, value: object) -> None:
    global _latest
    if id(module) in _watched:  # a read: safe without the lock under the GIL
        _latest = next(_counter)  # next() on a count is atomic under the GIL; returning None keeps the value


def install_registration_counter() -> None:
    """Install the global registration hooks once per process (idempotent, thread safe)."""
    global _installed
    with _lock:
        if _installed:
            return
        torch_module.register_module_parameter_registration_hook(_count_registration)
        torch_module.register_module_buffer_registration_hook(_count_registration)
        torch_module.register_module_module_registration_hook(_count_registration)
        _installed = True


def watch(module_ids: Iterable[int]) -> None:
    """Count registrations into the modules with these ids from now on."""
    with _lock:
        _watched.update(module_ids)


def unwatch(module_ids: Iterable[int]) -> None:
    """Stop counting registrations into these modules (once per earlier ``watch``)."""
    with _lock:
        for module_id in module_ids:
            _watched[module_id] -= 1
            if _watched[module_id] <= 0:
                del _watched[module_id]


def registrations() -> int:
    """A number that changes whenever a watched module registers a parameter, buffer or submodule."""
    return _latest
