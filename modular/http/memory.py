"""``GET /v1/memory``: device bytes over time from the offload log, and the host's bytes now.

Each device's samples are its engine's decisions (``offload.OffloadLog``): when, which model came, the bytes
used after it (the device's total less its free bytes) and why. The host part is this process's resident
set size and the bytes of host copies the engines hold.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

from components import ComponentsManager

__all__ = ["memory_report", "rss_bytes"]

MAX_SAMPLES = 500  # the latest decisions of each device


def rss_bytes() -> int:
    """This process's resident set size now (Linux: ``/proc/self/statm``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def memory_report(manager: ComponentsManager) -> dict[str, Any]:
    """``manager``'s devices with their offload samples, and this process's host bytes."""
    devices = []
    for engine in manager.offload_engines:
        total = engine.probe.total_bytes()
        samples = []
        for decision in list(engine.log)[-MAX_SAMPLES:]:
            used = None if total is None else total - decision.free_after
            samples.append(
                {"time": decision.time, "model": decision.model_id, "used": used, "reason": decision.reason}
            )
        devices.append(
            {
                "device": engine.probe.name,
                "total": total,
                "used": None if total is None else total - engine.probe.free_bytes(),
                "resident": engine.resident_ids(),
                "samples": samples,
            }
        )
    host_copies = sum(engine.host_tier.held_bytes() for engine in manager.offload_engines)
    return {"devices": devices, "host": {"rss": rss_bytes(), "host_copies": host_copies}}
