"""Weights on devices: memory probes, the forward hook, the residency ledger and eviction strategies.

This package knows modules, ids and byte sizes only; it imports nothing from the rest of the project.
"""

from typing import TYPE_CHECKING

from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".engine": ("OffloadEngine",),
        ".errors": (
            "DiskCopyError",
            "HostBudgetError",
            "ModelTooLargeError",
            "OffloadDeadlockError",
            "OffloadOutOfMemoryError",
            "OffloadTimeoutError",
            "StrategyError",
        ),
        ".host_tier": ("HostTier",),
        ".ledger": ("ResidencyLedger",),
        ".log": ("MergedOffloadLog", "OffloadDecision", "OffloadLog"),
        ".lru": ("LRUStrategy",),
        ".next_use": ("NextUseStrategy",),
        ".peer_strategy": ("PeerStrategy",),
        ".pinned": ("is_marked_pinned", "pin", "unpin"),
        ".plan": ("ExecutionPlan",),
        ".probes": ("DeviceProbe", "HostProbe", "MemoryProbe"),
        ".residency": ("Residency",),
        ".simulated": ("SimulatedDevice",),
        ".smallest_set": ("SmallestSufficientSet",),
        ".storage": ("module_fingerprint", "module_nbytes"),
        ".strategy": ("OffloadRequest", "OffloadStrategy", "strategy_name"),
        ".units": ("format_bytes", "format_bytes_distinct", "parse_bytes"),
        ".watermark": ("WatermarkStrategy",),
    },
)

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
