"""Pinned models: models auto offload keeps where they are (they cannot be moved, or their user said so).

A pinned model is attached like any other, so its calls count as running and follow the plan, but no hook
moves it: it is never placed, evicted, streamed or prefetched, is never offered to a strategy as a victim,
and has no host copy for the host tier to drop. The bytes it holds on the device are used memory from
attach: a real device's probe sees them, and a ``SimulatedDevice`` is told them (the ledger counts them), so
other models' placement leaves room for it.

Mark a module with ``pin(module)`` before it is attached (``OffloadEngine.attach(..., pinned=True)`` does the
same for one attach); the manager pins bitsandbytes-quantized models itself.
"""

from __future__ import annotations

import torch

from offload.devices.probes import MemoryProbe
from offload.devices.storage import module_nbytes
from offload.devices.units import format_bytes, format_bytes_distinct

__all__ = [
    "PINNED_MARK",
    "is_marked_pinned",
    "pin",
    "pinned_device_bytes",
    "pinned_input_device",
    "pinned_location",
    "pinned_too_large",
    "unpin",
]

#: The attribute ``pin`` sets on a module; it travels with the module to every manager and engine.
PINNED_MARK = "_offload_pinned"


def _check_not_attached(module: torch.nn.Module, what: str) -> None:
    hook = getattr(module, "_hf_hook", None)
    model_id = getattr(hook, "model_id", None)
    if getattr(hook, "engine", None) is not None and model_id is not None:  # our OffloadHook
        msg = (
            f"{what}: this module is attached to auto offload as {model_id!r}, which reads the mark only at "
            "attach. Detach it first (engine.detach, cm.disable_auto_cpu_offload() or cm.remove), then mark "
            "it and attach it again. Nothing was changed."
        )
        raise ValueError(msg)


def pin(module: torch.nn.Module) -> torch.nn.Module:
    """Mark ``module`` so that auto offload keeps it where it is; returns it.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
        ValueError: it is attached to an engine now (the mark is read at attach).
    """
    if not isinstance(module, torch.nn.Module):
        msg = f"pin() takes a torch.nn.Module (got {type(module)})."
        raise TypeError(msg)
    _check_not_attached(module, "pin()")
    setattr(module, PINNED_MARK, True)
    return module


def unpin(module: torch.nn.Module) -> torch.nn.Module:
    """Remove ``pin``'s mark: auto offload places ``module`` again once it is next attached; returns it.

    Raises:
        ValueError: it is attached to an engine now.
    """
    _check_not_attached(module, "unpin()")
    module.__dict__.pop(PINNED_MARK, None)
    return module


def is_marked_pinned(module: torch.nn.Module) -> bool:
    """Whether ``pin`` marked ``module``."""
    return module.__dict__.get(PINNED_MARK) is True


def _tensors(module: torch.nn.Module):
    yield from module.parameters()
    yield from module.buffers()


def pinned_device_bytes(probe: MemoryProbe, module: torch.nn.Module) -> int:
    """Bytes a pinned ``module`` holds on ``probe``'s device: all of it on a simulated device (it stands
    there), what sits on the execution device on a real one, nothing on the host (``device="cpu"``)."""
    if probe.always_resident:
        return 0
    if not probe.moves_weights:
        return module_nbytes(module, count_meta=False)
    return module_nbytes(module, count_meta=False, device=probe.execution_device)


def pinned_location(probe: MemoryProbe, module: torch.nn.Module) -> str:
    """Where a pinned model stays, for tables: the simulated device's name, else the device of its tensors."""
    if not probe.moves_weights:
        return probe.name
    devices = sorted({str(tensor.device) for tensor in _tensors(module)})
    return ",".join(devices) or probe.name


def pinned_input_device(probe: MemoryProbe, module: torch.nn.Module) -> torch.device:
    """Where a pinned model's inputs go: the device of its first tensor (the execution device if it has none
    or stands on a simulated device)."""
    if not probe.moves_weights:
        return probe.execution_device
    first = next(_tensors(module), None)
    return probe.execution_device if first is None else first.device


def pinned_too_large(sizes: dict[str, int], room: int, device: str, margin: int, after: str = "") -> str:
    """The message for pinned models whose bytes leave no room on the device (``room``: the device less the
    margin and the pinned models already attached)."""
    need, room_text, *texts = format_bytes_distinct(sum(sizes.values()), max(room, 0), *sizes.values())
    listed = [f"{model_id!r} ({size})" for model_id, size in zip(sizes, texts)]
    what = (
        f"pinned model {next(iter(sizes))!r} needs {need}"
        if len(listed) == 1
        else f"pinned models {', '.join(listed[:-1])} and {listed[-1]} need {need} in all"
    )
    return (
        f"{what} on {device}, but at most {room_text} is there for pinned models (memory_reserve_margin "
        f"{format_bytes(margin)}): auto offload cannot move a pinned model to make room. Use a larger device or "
        "a smaller memory_reserve_margin, unpin a model you pinned (offload.unpin), or load it unquantized so "
        f"that it can be offloaded.{after}"
    )
