"""A count of registrations into attached models, so that a model's structure is re-read only after one.

Adding a LoRA (peft injects new submodules with ``setattr``), swapping a submodule or assigning a new
parameter or buffer all go through ``torch.nn.Module``'s registration, which calls the global hooks
installed here. The hooks count only registrations into *watched* modules (the submodules of attached
models), so modules built elsewhere, or the throwaway ``ModuleList`` a diffusers UNet makes with
``self.resnets[1:]`` at every step, leave the count alone. Checking whether a model may have changed
is then one integer comparison; only when the count moved is the model walked
(``offload.devices.storage.module_fingerprint``).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable

import torch
from torch.nn.modules import module as torch_module

__all__ = ["install_registration_counter", "registrations", "unwatch", "watch", "watched_count"]

_counter = itertools.count(1)
_latest = 0
# module -> how many ledger entries watch it. Held weakly: a model dropped without being detached (its
# engine garbage-collected) must not leave its id behind for a new module to inherit.
# Test: test_a_module_that_reuses_a_dropped_models_id_is_not_watched.
_watched: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_installed = False


def _count_registration(module: torch.nn.Module, name: str, value: object) -> None:
    global _latest
    if module in _watched:  # a read: safe without the lock under the GIL
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


def watch(modules: Iterable[torch.nn.Module]) -> None:
    """Count registrations into these modules from now on."""
    with _lock:
        for module in modules:
            _watched[module] = _watched.get(module, 0) + 1


def unwatch(modules: Iterable[torch.nn.Module]) -> None:
    """Stop counting registrations into these modules (once per earlier ``watch``)."""
    with _lock:
        for module in modules:
            count = _watched.get(module, 0) - 1
            if count <= 0:
                _watched.pop(module, None)
            else:
                _watched[module] = count


def registrations() -> int:
    """A number that changes whenever a watched module registers a parameter, buffer or submodule."""
    return _latest


def watched_count() -> int:
    """How many modules are watched now (those of attached models that are still alive)."""
    with _lock:
        return len(_watched)
