"""A real accelerator of which only a byte budget may hold weights."""

from __future__ import annotations

import torch

from offload.devices.probes import DeviceProbe
from offload.devices.units import format_bytes, parse_bytes

__all__ = ["BudgetedDevice"]


class BudgetedDevice(DeviceProbe):
    """A CUDA (or other probed) device on which the resident weights stay within ``budget`` bytes.

    Free memory is the smaller of what the device reports free and the budget minus the bytes of
    the models resident on it, so one card can stand in for a smaller one: weights really move and
    forwards really run there, and the engine decides as it would on a card of ``budget`` bytes.

    Args:
        device: ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.
        budget: Bytes, or a string such as ``"8GB"``.
    """

    def __init__(self, device: str | torch.device, budget: int | str):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(device)
        self.budget = parse_bytes(budget, name="BudgetedDevice budget")
        self._resident: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"BudgetedDevice({str(self.execution_device)!r}, budget={format_bytes(self.budget)!r})"

    def used_bytes(self) -> int:
        """Bytes of the models resident on this device now."""
        return sum(self._resident.values())

    def free_bytes(self) -> int:
        return min(super().free_bytes(), self.budget - self.used_bytes())

    def total_bytes(self) -> int | None:
        total = super().total_bytes()
        return self.budget if total is None else min(total, self.budget)

    def on_resident(self, model_id: str, nbytes: int) -> None:
        self._resident[model_id] = nbytes

    def on_evicted(self, model_id: str) -> None:
        self._resident.pop(model_id, None)
