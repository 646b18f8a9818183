"""Memory probes: how much of the execution device is free, and where forwards run.

A probe is the engine's only view of the device. ``DeviceProbe`` reads a real accelerator;
``SimulatedDevice`` (in ``simulated.py``) answers from a byte budget so that every decision can be
made and tested without one; ``HostProbe`` is ``device="cpu"``: everything is resident, nothing moves.
"""

from __future__ import annotations

import sys

import torch

from offload.devices.units import format_bytes

__all__ = ["DeviceProbe", "HostProbe", "MemoryProbe", "resolve_probe"]


class MemoryProbe:
    """Base of every probe. Subclasses override ``free_bytes`` and set the class attributes.

    Attributes:
        moves_weights: True when the ledger must copy tensors to ``execution_device`` to make a model
            resident; False when residency is bookkeeping only (simulated device, CPU).
        always_resident: True when every attached model counts as resident from the start (CPU).
    """

    moves_weights: bool = True
    always_resident: bool = False

    @property
    def name(self) -> str:
        """Short name of the device for tables, e.g. ``"cuda:0"``."""
        return str(self.execution_device)

    @property
    def execution_device(self) -> torch.device:
        """Where forwards run and where inputs are sent."""
        raise NotImplementedError

    def free_bytes(self) -> int:
        """Bytes that can still be given to weights on the device (before the engine's margin)."""
        raise NotImplementedError

    def total_bytes(self) -> int | None:
        """Total bytes of the device, or None when unknown."""
        return None

    def describe(self) -> str:
        """The name and size for messages: ``"cuda:0 (total 79.11 GiB)"``, or the name when the size is unknown."""
        total = self.total_bytes()
        return self.name if total is None else f"{self.name} (total {format_bytes(total)})"

    def on_resident(self, model_id: str, nbytes: int) -> None:
        """Called by the ledger after ``model_id`` became resident (bookkeeping probes count it)."""

    def on_evicted(self, model_id: str) -> None:
        """Called by the ledger after ``model_id`` left the device."""

    def on_moved(self, nbytes: int) -> None:
        """Called by the engine after one decision moved ``nbytes`` to the device (what its log records)."""

    def hold_room(self, model_id: str, nbytes: int) -> None:
        """Called by a streaming model (``offload.partial.streaming``) with the bytes of the room it holds for its
        streamed groups that no tensor occupies now. Bookkeeping probes count that room already (they are
        told the model's footprint); a real device must not report it free. Reset by ``on_resident`` and
        ``on_evicted``."""


class DeviceProbe(MemoryProbe):
    """A real accelerator whose torch backend has ``mem_get_info`` (CUDA, XPU, ...).

    Free memory is what the driver reports free plus what PyTorch's caching allocator holds reserved
    but not allocated: evicted weights return to that cache, not to the driver, and are reusable.
    """

    def __init__(self, device: torch.device):
        self._device = device
        # Room streaming models hold for their streamed groups and do not occupy between forwards: the
        # driver reports it free, but giving it to another model would leave no room to stream into.
        self._held: dict[str, int] = {}
        self._backend = torch.get_device_module(device.type)
        if getattr(self._backend, "mem_get_info", None) is None:
            msg = (
                f"device {str(device)!r} cannot be probed: torch.{device.type} has no mem_get_info(). "
                "Pass a CUDA device, or a SimulatedDevice('8GB') to decide by a byte budget."
            )
            raise ValueError(msg)

    @property
    def execution_device(self) -> torch.device:
        return self._device

    def _index(self) -> int:
        return self._device.index if self._device.index is not None else self._backend.current_device()

    def free_bytes(self) -> int:
        return self._driver_free() - sum(self._held.values())

    def _driver_free(self) -> int:
        """What the driver reports free, plus the allocator's cached blocks."""
        index = self._index()
        free, _ = self._backend.mem_get_info(index)
        reserved = getattr(self._backend, "memory_reserved", None)
        allocated = getattr(self._backend, "memory_allocated", None)
        if reserved is not None and allocated is not None:
            free += reserved(index) - allocated(index)
        return int(free)

    def on_resident(self, model_id: str, nbytes: int) -> None:
        self._held.pop(model_id, None)

    def on_evicted(self, model_id: str) -> None:
        self._held.pop(model_id, None)

    def hold_room(self, model_id: str, nbytes: int) -> None:
        self._held[model_id] = nbytes

    def total_bytes(self) -> int | None:
        return int(self._backend.mem_get_info(self._index())[1])


class HostProbe(MemoryProbe):
    """``device="cpu"``: forwards run on the host, every model is resident, nothing ever moves."""

    moves_weights = False
    always_resident = True

    @property
    def execution_device(self) -> torch.device:
        return torch.device("cpu")

    def free_bytes(self) -> int:
        return sys.maxsize


def resolve_probe(device: object) -> MemoryProbe:
    """Return the probe for ``device`` (None, a string, a ``torch.device`` or a ``MemoryProbe``).

    ``None`` picks ``cuda`` when available. ``"cpu"`` is accepted as a no-op placement.

    Raises:
        ValueError: no device given and no CUDA, or a device that cannot be probed.
        TypeError: ``device`` is of an unsupported type.
    """
    if isinstance(device, MemoryProbe):
        return device
    if device is None:
        if not torch.cuda.is_available():
            msg = (
                "device=None picks CUDA, but torch.cuda.is_available() is False. Pass a device "
                "(device='cuda:0'), device='cpu' to keep every model on the host, or a "
                "SimulatedDevice('8GB') to run every offload decision against a byte budget."
            )
            raise ValueError(msg)
        device = "cuda"
    if isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            device = torch.device(device)
        except RuntimeError as error:
            msg = f"device {device!r} is not a torch device string. Use e.g. 'cuda', 'cuda:0' or 'cpu'."
            raise ValueError(msg) from error
    if not isinstance(device, torch.device):
        msg = (
            f"device must be None, a string such as 'cuda:0', a torch.device or a SimulatedDevice "
            f"(got {device!r} that is a {type(device)})."
        )
        raise TypeError(msg)
    if device.type == "cpu":
        return HostProbe()
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if callable(is_available) and not is_available():
        msg = (
            f"device {str(device)!r}: torch.{device.type}.is_available() is False on this machine. Pass a "
            "device that exists, device='cpu' to keep every model on the host, or a SimulatedDevice('8GB') "
            "to run every offload decision against a byte budget."
        )
        raise ValueError(msg)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return DeviceProbe(device)
