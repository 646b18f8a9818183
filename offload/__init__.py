"""Weights on devices: memory probes, the forward hook, the residency ledger and eviction strategies.

This package knows modules, ids and byte sizes only; it imports nothing from the rest of the project.
"""

from typing import TYPE_CHECKING

from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from offload.devices.probes import DeviceProbe, HostProbe, MemoryProbe
    from offload.devices.simulated import SimulatedDevice
    from offload.devices.storage import module_fingerprint, module_nbytes
    from offload.devices.units import format_bytes, format_bytes_distinct, parse_bytes
    from offload.engine.engine import OffloadEngine
    from offload.errors import (
        DeviceMoveError,
        DiskCopyError,
        HostBudgetError,
        ModelTooLargeError,
        OffloadDeadlockError,
        OffloadOutOfMemoryError,
        OffloadTimeoutError,
        StrategyError,
    )
    from offload.host.host_tier import HostTier
    from offload.records.log import MergedOffloadLog, OffloadDecision, OffloadLog
    from offload.records.offload_record import OffloadEvent, OffloadRecord
    from offload.records.residency import Residency
    from offload.strategies.lru import LRUStrategy
    from offload.strategies.next_use import NextUseStrategy
    from offload.strategies.peer_strategy import PeerStrategy
    from offload.strategies.plan import ExecutionPlan
    from offload.strategies.smallest_set import SmallestSufficientSet
    from offload.strategies.strategy import OffloadRequest, OffloadStrategy, strategy_name
    from offload.strategies.watermark import WatermarkStrategy
    from offload.weights.ledger import ResidencyLedger
    from offload.weights.pinned import is_marked_pinned, pin, unpin

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "DeviceMoveError",
    "DeviceProbe",
    "DiskCopyError",
    "ExecutionPlan",
    "HostBudgetError",
    "HostProbe",
    "HostTier",
    "LRUStrategy",
    "MemoryProbe",
    "MergedOffloadLog",
    "ModelTooLargeError",
    "OffloadDeadlockError",
    "NextUseStrategy",
    "OffloadDecision",
    "OffloadEngine",
    "OffloadEvent",
    "OffloadLog",
    "OffloadOutOfMemoryError",
    "OffloadRecord",
    "OffloadTimeoutError",
    "OffloadRequest",
    "OffloadStrategy",
    "PeerStrategy",
    "Residency",
    "ResidencyLedger",
    "SimulatedDevice",
    "SmallestSufficientSet",
    "StrategyError",
    "WatermarkStrategy",
    "format_bytes",
    "format_bytes_distinct",
    "is_marked_pinned",
    "module_fingerprint",
    "module_nbytes",
    "parse_bytes",
    "pin",
    "strategy_name",
    "unpin",
]
