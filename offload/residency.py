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
    """

    attached: bool
    resident: bool
    device: str
    execution_device: torch.device
