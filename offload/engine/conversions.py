"""A hooked model's own ``.to(...)``: a device move is refused, a dtype conversion goes through the engine.

Auto offload decides where a hooked model's weights are: on the execution device while it is resident, on
its retained host copy otherwise. A ``.to(device)`` by hand moves tensors behind the ledger's back (a
classic diffusers pipeline built on the manager's components, ``FluxPipeline(**cm.components_for(...))``,
calls ``module.to(device, dtype)`` on every model from its ``pipe.to(...)``): on CUDA a resident model
moved to the CPU still counts as resident, so its next forward meets inputs on the device and weights on
the host. A dtype conversion of a resident model converts the device tensors only: the next eviction points
the parameters back at the host copies, of the old dtype, and the ledger keeps counting the old size.

So the hook replaces the model's ``to`` (as it replaces its ``state_dict``), with the rule that
``ModularPipeline.to`` applies too (``modular/pipeline/devices.py``):

- a device that would move a weight (a tensor of the model is elsewhere) is refused with
  ``DeviceMoveError``, before anything changes; a device every tensor is on already is no move, so the
  libraries' own ``self.to(device=self.device, dtype=self.dtype)`` (diffusers' IP-Adapter and LoRA loaders)
  pass;
- a dtype (or memory format) conversion runs with the model off the device and its host copy in memory
  (``OffloadEngine.convert``): it converts the host copy itself, the model is measured again, and its next
  placement uploads the new weights. SD and SDXL decoding upcast the VAE this way (``vae.to(dtype=...)``).
  A conversion that changes no tensor (the dtype it has) does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from offload.errors import DeviceMoveError

if TYPE_CHECKING:
    from offload.engine.hook import OffloadHook

__all__ = ["check_move", "guarded_to", "parse_to", "would_convert", "would_move"]


def parse_to(args: tuple, kwargs: dict) -> tuple[torch.device | None, torch.dtype | None, Any]:
    """``(device, dtype, memory_format)`` of a ``module.to(*args, **kwargs)`` call, read as torch reads it."""
    device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    return device, dtype, memory_format


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def would_move(module: torch.nn.Module, device: torch.device) -> bool:
    """True if ``module.to(device)`` would move a tensor (one is on another device; ``cuda`` means the
    current CUDA device)."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    for tensor in _tensors(module):
        here = tensor.device
        if here.type != device.type or (device.index is not None and here.index != device.index):
            return True
    return False


def would_convert(module: torch.nn.Module, dtype: torch.dtype | None, memory_format: Any) -> bool:
    """True if ``module.to(dtype, memory_format=...)`` would change a tensor (a floating-point one of another
    dtype; any memory format given)."""
    if memory_format is not None:
        return True
    if dtype is None:
        return False
    if not (dtype.is_floating_point or dtype.is_complex):
        return True  # torch's own .to refuses it, with its message
    return any(t.is_floating_point() and t.dtype != dtype for t in _tensors(module))


def move_refused_message(names: Sequence[str], device: torch.device) -> str:
    """The refusal of a hand-made device move, the same from a model's ``.to`` and a pipeline's."""
    return (
        f"auto offload places {list(names)} on its own (on the device while they run, on their host copies "
        f"otherwise); moving them to {device} by hand would bypass it. Leave devices to auto offload (a dtype "
        "alone, .to(torch.bfloat16), is converted through it), or call components_manager.disable_auto_cpu_offload() "
        "first, then .to(...), then enable it again."
    )


def check_move(names: Sequence[str], modules: Sequence[torch.nn.Module], args: tuple, kwargs: dict) -> None:
    """Raise ``DeviceMoveError`` naming those of ``names`` whose module ``.to(*args, **kwargs)`` would move.

    Raises:
        DeviceMoveError: the call names a device and would move a weight of one of them.
    """
    device, _, _ = parse_to(args, kwargs)
    if device is None:
        return
    moving = [name for name, module in zip(names, modules) if would_move(module, device)]
    if moving:
        raise DeviceMoveError(move_refused_message(moving, device))


def guarded_to(hook: OffloadHook, module: torch.nn.Module) -> Callable[..., Any]:
    """The ``to`` a hooked ``module`` gets: the rule above, then its own ``to`` for a conversion."""
    bound: Callable[..., Any] = module.to  # also the libraries' overrides (ModelMixin.to, PreTrainedModel.to)

    @functools.wraps(bound)
    def to(*args: Any, **kwargs: Any) -> torch.nn.Module:
        check_move([hook.model_id], [module], args, kwargs)
        _, dtype, memory_format = parse_to(args, kwargs)
        if would_convert(module, dtype, memory_format):
            # The dtype alone: the device was checked to move nothing, and the engine takes the model off it.
            options: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
            if memory_format is not None:
                options["memory_format"] = memory_format
            hook.engine.convert(hook.model_id, lambda: bound(**options))
        return module

    return to
