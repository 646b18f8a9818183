"""Weights on devices: memory probes, the forward hook, the residency ledger and eviction strategies.

This package knows modules, ids and byte sizes only; it imports nothing from the rest of the project.
"""

from offload.engine import OffloadEngine
from offload.errors import (
    DiskCopyError,
    HostBudgetError,
    ModelTooLargeError,
    OffloadDeadlockError,
    OffloadOutOfMemoryError,
    OffloadTimeoutError,
    StrategyError,
)
from offload.host_tier import HostTier
from offload.ledger import ResidencyLedger
from offload.log import MergedOffloadLog, OffloadDecision, OffloadLog
from offload.lru import LRUStrategy
from offload.next_use import NextUseStrategy
from offload.peer_strategy import PeerStrategy
from offload.pinned import is_marked_pinned, pin, unpin
from offload.plan import ExecutionPlan
from offload.probes import DeviceProbe, HostProbe, MemoryProbe
from offload.residency import Residency
from offload.simulated import SimulatedDevice
from offload.smallest_set import SmallestSufficientSet
from offload.storage import module_fingerprint, module_nbytes
from offload.strategy import OffloadRequest, OffloadStrategy, strategy_name
from offload.units import format_bytes, format_bytes_distinct, parse_bytes
from offload.watermark import WatermarkStrategy

__all__ = [
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
    "OffloadLog",
    "OffloadOutOfMemoryError",
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
