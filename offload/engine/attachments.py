"""The lifecycle of an engine's models: attach, detach, close.

``attach`` checks a module before anything moves (its id, a foreign hook, a pinned model's room, the host
budget), then hooks it and keeps its weights on the host copy; ``detach`` and ``close`` wait for the calls
in progress, then take models off with every weight on the host (a model on disk read back first, unless
``detach`` is told not to read: then it leaves without the weights it held on disk only). The engine holds the state and the lock;
these are the bodies of ``OffloadEngine.attach``, ``detach`` and ``close``, which document them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from offload.engine.fit import check_pinned_attach
from offload.engine.hook import OffloadHook, check_no_foreign_hook, install_hook, remove_hook
from offload.errors import DiskCopyError
from offload.weights.pinned import is_marked_pinned, pinned_input_device

if TYPE_CHECKING:
    from offload.engine.engine import OffloadEngine

__all__ = ["attach", "close", "detach"]


def attach(
    engine: OffloadEngine, model_id: str, module: torch.nn.Module, weight_files: Sequence[str], pinned: bool
) -> None:
    """``OffloadEngine.attach``."""
    if not isinstance(module, torch.nn.Module):
        msg = f"attach({model_id!r}, ...) needs a torch.nn.Module (got {type(module)})."
        raise TypeError(msg)
    hooks, ledger, placer, host = engine._hooks, engine._ledger, engine._placer, engine._host
    with engine._lock:
        if model_id in hooks:
            if ledger.module(model_id) is module:
                return
            msg = f"model id {model_id!r} is already attached to another module; detach({model_id!r}) first."
            raise ValueError(msg)
        other = ledger.id_of(module)  # an index: attaching does not look at the other models
        if other is not None:
            msg = (
                f"this module is already attached as {other!r}; one module can be attached under one id only."
            )
            raise ValueError(msg)
        check_no_foreign_hook(module, model_id)  # before anything moves
        pinned = pinned or is_marked_pinned(module)
        if pinned:
            check_pinned_attach(placer, model_id, module)
        else:
            host.check_fit({model_id: module}, {model_id: weight_files})
        free_before = engine.probe.free_bytes()
        hook = OffloadHook(engine, model_id, pinned_input_device(engine.probe, module) if pinned else None)
        moved_back = ledger.add(model_id, module, pinned)
        try:
            victims, to_host = placer.room_beside_pinned(model_id) if pinned else ([], 0)
            install_hook(module, hook)
        except Exception:
            ledger.remove(model_id)
            raise
        hooks[model_id] = hook
        if pinned:  # no host copy to keep under the host budget
            placer.record(model_id, victims, 0, to_host, free_before, "pinned")
            return
        host.attach(model_id, module, weight_files)
        if moved_back:
            placer.record(model_id, (), 0, moved_back, free_before, "attach")


def detach(engine: OffloadEngine, model_id: str, read_back: bool) -> None:
    """``OffloadEngine.detach``."""
    with engine._changed:
        if model_id not in engine._hooks:
            msg = f"model id {model_id!r} is not attached; attached: {sorted(engine._hooks)}."
            raise KeyError(msg)
        engine._calls.await_no_calls([model_id], f"detach({model_id!r})", engine.wait_timeout)
        if read_back:
            engine._host.restore(model_id)  # before anything changes: a file gone leaves it attached
        _detach_now(engine, model_id)
        engine._changed.notify_all()


def close(engine: OffloadEngine) -> None:
    """``OffloadEngine.close``."""
    with engine._changed:
        model_ids = list(engine._hooks)
        engine._calls.await_no_calls(model_ids, "close()", engine.wait_timeout)
        unreadable: list[DiskCopyError] = []
        for model_id in model_ids:
            if model_id in engine._hooks:  # another thread may have detached it while we waited
                try:
                    engine._host.restore(model_id)
                except DiskCopyError as error:  # detached without its weights (meta); said once all are
                    unreadable.append(error)
                _detach_now(engine, model_id, "close")
        engine._host.close()
        engine._changed.notify_all()
        if unreadable:
            raise unreadable[0]


def _detach_now(engine: OffloadEngine, model_id: str, reason: str = "detach") -> None:
    """Take ``model_id`` off now (no call of it in progress): unhooked, forgotten, its weights on the host;
    logged as ``reason`` if it was on the device (``"close"`` when the engine closes)."""
    ledger, probe, placer = engine._ledger, engine.probe, engine._placer
    module = ledger.module(model_id)
    size = ledger.nbytes(model_id)  # read before the ledger forgets it
    was_resident = ledger.is_resident(model_id) and not ledger.is_pinned(model_id)
    ledger.remove(model_id)
    remove_hook(module)
    del engine._hooks[model_id]
    placer.forget(model_id)
    if was_resident and not probe.always_resident:
        placer.record(model_id, (model_id,), 0, 0, probe.free_bytes(), reason, sizes=(size, size))
    engine._host.detach(model_id, read_back=False)  # read back before, if at all
