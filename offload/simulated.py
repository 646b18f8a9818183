"""A simulated device: a memory probe with a byte budget, so every offload decision runs without a GPU."""

from __future__ import annotations

import torch

from offload.probes import MemoryProbe
from offload.units import format_bytes, parse_bytes

__all__ = ["SimulatedDevice"]


class SimulatedDevice(MemoryProbe):
    """A device of ``budget`` bytes. Forwards run on the CPU; the weights never move.

    Free memory is the budget minus the bytes of the models resident on it, so the engine, the
    ledger and the strategies decide exactly as they would on CUDA. One simulated device shared by
    two engines shares its budget, as a real card would.

    Args:
        budget: Bytes, or a string such as ``"8GB"``.
        name: Name shown in device cells, e.g. ``"sim"`` -> ``"cpu(sim)"``.

    Example:
        >>> SimulatedDevice("8GB").free_bytes()
        8000000000
    """

    moves_weights = False

    def __init__(self, budget: int | str, name: str = "sim"):
        self.budget = parse_bytes(budget, name="SimulatedDevice budget")
        self._name = name
        self._resident: dict[str, int] = {}

    def __repr__(self) -> str:
        return (
            f"SimulatedDevice(budget={format_bytes(self.budget)!r}, used={format_bytes(self.used_bytes())!r})"
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def execution_device(self) -> torch.device:
        return torch.device("cpu")

    def used_bytes(self) -> int:
        """Bytes of the models resident on this device now."""
        return sum(self._resident.values())

    def free_bytes(self) -> int:
        return self.budget - self.used_bytes()

    def total_bytes(self) -> int:
        return self.budget

    def describe(self) -> str:
        return f"{self.name} (budget {format_bytes(self.budget)})"

    def on_resident(self, model_id: str, nbytes: int) -> None:
        self._resident[model_id] = nbytes

    def on_evicted(self, model_id: str) -> None:
        self._resident.pop(model_id, None)
