"""A simulated device: a memory probe with a byte budget, so every offload decision runs without a GPU."""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from offload.devices.probes import MemoryProbe
from offload.devices.units import format_bytes, parse_bytes

__all__ = ["SimulatedDevice"]


class SimulatedDevice(MemoryProbe):
    """A device of ``budget`` bytes. Forwards run on the CPU; the weights never move.

    Free memory is the budget minus the bytes of the models resident on it, so the engine, the
    ledger and the strategies decide exactly as they would on CUDA. One simulated device shared by
    two engines shares its budget, as a real card would.

    Given ``h2d_bandwidth``, the engine keeps a simulated clock (``offload.devices.clock``): every copy takes
    bytes / bandwidth, every forward its ``compute_time``, and the log carries start and end times. With
    ``real_time`` too, every move also takes bytes / bandwidth on the wall clock (the thread that placed the
    model sleeps), so a process measured in real time (a replica of ``benchmarks/serving.py --ray``) pays for
    its moves as it would on a device.

    Args:
        budget: Bytes, or a string such as ``"8GB"``.
        name: Name shown in device cells, e.g. ``"sim"`` -> ``"cpu(sim)"``.
        h2d_bandwidth: Host-to-device bytes per second, or a string such as ``"25GB/s"``; None: no clock.
        compute_time: Seconds one call of each model takes, by model id (the clock's hint).
        real_time: Moves sleep bytes / ``h2d_bandwidth`` seconds (needs ``h2d_bandwidth``).

    Raises:
        ValueError: a bad budget or bandwidth, or ``real_time`` without a bandwidth.
        TypeError: ``compute_time`` is not a table of model ids to seconds.

    Example:
        >>> SimulatedDevice("8GB").free_bytes()
        8000000000
    """

    moves_weights = False

    def __init__(
        self,
        budget: int | str,
        name: str = "sim",
        h2d_bandwidth: int | str | None = None,
        compute_time: Mapping[str, float] | None = None,
        real_time: bool = False,
    ):
        self.budget = parse_bytes(budget, name="SimulatedDevice budget")
        self._name = name
        self.h2d_bandwidth = _bandwidth(h2d_bandwidth)
        self.compute_time = _compute_time(compute_time)
        if real_time and self.h2d_bandwidth is None:
            raise ValueError("real_time moves take bytes / h2d_bandwidth: give h2d_bandwidth, e.g. '100MB/s'")
        self.real_time = bool(real_time)
        self._resident: dict[str, int] = {}
        self._used = 0  # sum of ``_resident``, kept as it changes: free_bytes is asked at every placement

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
        return self._used

    def free_bytes(self) -> int:
        return self.budget - self.used_bytes()

    def total_bytes(self) -> int:
        return self.budget

    def describe(self) -> str:
        return f"{self.name} (budget {format_bytes(self.budget)})"

    def on_resident(self, model_id: str, nbytes: int) -> None:
        self._used += nbytes - self._resident.get(model_id, 0)
        self._resident[model_id] = nbytes

    def on_evicted(self, model_id: str) -> None:
        self._used -= self._resident.pop(model_id, 0)

    def on_moved(self, nbytes: int) -> None:
        # Under the engine's lock, as a real copy holds the one copy engine: placements queue behind it.
        if self.real_time and self.h2d_bandwidth and nbytes > 0:
            time.sleep(nbytes / self.h2d_bandwidth)


def _bandwidth(value: int | str | None) -> int | None:
    if value is None:
        return None
    text = value[:-2] if isinstance(value, str) and value.rstrip().endswith("/s") else value
    nbytes = parse_bytes(text.rstrip() if isinstance(text, str) else text, name="h2d_bandwidth")
    if nbytes <= 0:
        msg = f"h2d_bandwidth must be positive (got {value!r}). Example: '25GB/s'."
        raise ValueError(msg)
    return nbytes


def _compute_time(value: Mapping[str, float] | None) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        msg = (
            f"compute_time must map model ids to seconds per call (got {value!r}). Example: {{'unet': 0.05}}."
        )
        raise TypeError(msg)
    bad = {k: v for k, v in value.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0}
    if bad or not all(isinstance(k, str) for k in value):
        msg = f"compute_time must map model ids (strings) to seconds >= 0 (bad: {bad or value!r})."
        raise ValueError(msg)
    return {k: float(v) for k, v in value.items()}
