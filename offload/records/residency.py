"""What the engine reports about one model: whether it places it, whether it is on the device, and where."""

from __future__ import annotations

import attrs
import torch

__all__ = ["Residency"]


@attrs.frozen
class Residency:
    """Facts about one model as an ``OffloadEngine`` sees them; tables and tools format them.

    Attributes:
        attached: The model carries the engine's hook: the engine places it.
        resident: Its weights are on the execution device now (on a host-only device, every attached
            model counts as resident); otherwise they are on their host copy.
        device: The execution device's short name, e.g. ``"cuda:0"``, ``"sim"`` or ``"cpu"``.
        execution_device: Where its forwards run (the CPU for a simulated device).
        on_disk: Its host copy was dropped under the host budget: its weights are on disk only until it is
            next placed (``offload.host.host_tier``).
        disk_nbytes: While on disk, the bytes of its weights (the placeholders in its slots hold none).
        resident_share: While partly resident (its tail streamed per call: ``offload.partial.beyond``), the share of
            its bytes kept on the device, e.g. ``0.62``; None otherwise.
        pinned: Where a pinned model stays (``offload.weights.pinned``): the simulated device's name, else the device
            of its tensors, e.g. ``"cuda:0"``; None when it is not pinned.
    """

    attached: bool
    resident: bool
    device: str
    execution_device: torch.device
    on_disk: bool = False
    disk_nbytes: int = 0
    resident_share: float | None = None
    pinned: str | None = None
