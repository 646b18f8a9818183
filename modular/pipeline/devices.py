"""Where a pipeline's models are: ``to``, ``device``, ``dtype`` and the execution device of ``ModularPipeline``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch

from offload.devices.storage import module_nbytes
from offload.engine.conversions import check_move
from offload.engine.hook import OffloadHook

if TYPE_CHECKING:
    from components import ComponentsManager

__all__ = ["DeviceMethods"]

_Pipeline = TypeVar("_Pipeline", bound="DeviceMethods")


class DeviceMethods:
    """The device methods of ``ModularPipeline``: its models are the ``torch.nn.Module`` components."""

    _components: dict[str, Any]
    _components_manager: ComponentsManager | None

    def to(self: _Pipeline, *args: Any, **kwargs: Any) -> _Pipeline:
        """Move or convert every model (``torch.nn.Module`` component) like ``module.to(...)``; return the pipeline.

        Under auto offload, the rule of a hooked model's own ``.to`` (``offload/engine/conversions.py``), the same
        for a classic diffusers pipeline built on the manager's components: a dtype is converted through the
        engine (host copies converted, sizes measured again); a device that would move a weight is refused.

        Raises:
            DeviceMoveError: (a ValueError) a device move of models auto offload places, naming them; checked for
                every model before any changes.
        """
        cm = self._components_manager
        if cm is not None:
            hooked = {n: obj for n, obj in self._components.items() if cm.is_auto_offloaded(obj)}
            check_move(list(hooked), list(hooked.values()), args, kwargs)
        for obj in self._components.values():
            if isinstance(obj, torch.nn.Module):
                obj.to(*args, **kwargs)
        return self

    def _modules(self) -> list[torch.nn.Module]:
        return [obj for obj in self._components.values() if isinstance(obj, torch.nn.Module)]

    @property
    def device(self) -> torch.device:
        """The device of the first model's parameters (the CPU without models)."""
        for module in self._modules():
            for tensor in module.parameters():
                return tensor.device
        return torch.device("cpu")

    @property
    def _execution_device(self) -> torch.device:
        """Where models run: the offload hook's execution device when there is one, else their device.

        When hooks run models on several devices (auto offload over a device list), the denoiser's (the
        largest model's): latents and timesteps are made where it runs, and other models' hooks move inputs.
        """
        hooked = {}
        for module in self._modules():
            device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
            if device is not None:
                hooked[module] = torch.device(device)
        if len(set(hooked.values())) > 1:
            return hooked[max(hooked, key=_nbytes)]
        return next(iter(hooked.values()), self.device)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the first model's parameters (float32 without models)."""
        for module in self._modules():
            for tensor in module.parameters():
                return tensor.dtype
        return torch.float32


def _nbytes(module: torch.nn.Module) -> int:
    """A hooked model's size: its offload engine's count when it has one (read at every ``_execution_device``,
    so no walk of its tensors), else its tensors' bytes."""
    hook = getattr(module, "_hf_hook", None)
    return hook.nbytes if isinstance(hook, OffloadHook) else module_nbytes(module)
