"""A list of devices for auto offload: each becomes a probe, checked as a whole before any engine is built.

``enable_auto_cpu_offload(device=["cuda:0", "cuda:1"])`` runs one ``OffloadEngine`` per device. The list is
refused when it names no device, one device twice, a device the machine lacks, ``"cpu"`` (which places
nothing), or simulated and real devices together (a simulated device runs forwards on the CPU, so its
budget would say nothing about a real card beside it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from offload.devices.probes import DeviceProbe, MemoryProbe, resolve_probe

__all__ = ["is_device_list", "resolve_devices"]


def is_device_list(device: object) -> bool:
    """Whether ``device`` is a list (or tuple) of devices rather than one device."""
    return isinstance(device, (list, tuple))


def resolve_devices(devices: Sequence[object]) -> list[MemoryProbe]:
    """One probe per entry of ``devices``, in order.

    Raises:
        ValueError: the list is empty, an entry is ``"cpu"`` or a device the machine lacks (its index past
            the device count, or its backend unavailable), two entries are one device (same name), or
            simulated and real devices are mixed.
        TypeError: an entry is not a device (``offload.devices.probes.resolve_probe``).
    """
    if not devices:
        msg = (
            "device=[] names no device. Pass one device (device='cuda:0') or several "
            "(device=['cuda:0', 'cuda:1'] or a list of SimulatedDevice)."
        )
        raise ValueError(msg)
    probes = [_probe(index, entry) for index, entry in enumerate(devices)]
    names = [probe.name for probe in probes]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        msg = (
            f"device list {_shown(devices)} names {repeated} more than once; each device runs one engine. "
            "List each device once (give each SimulatedDevice its own name=...)."
        )
        raise ValueError(msg)
    real = [isinstance(probe, DeviceProbe) for probe in probes]
    if any(real) and not all(real):
        msg = (
            f"device list {_shown(devices)} mixes SimulatedDevice and real devices; a simulated device "
            "runs forwards on the CPU. Use only real devices, or only SimulatedDevices."
        )
        raise ValueError(msg)
    return probes


def _probe(index: int, entry: object) -> MemoryProbe:
    try:
        probe = resolve_probe(entry)
    except (ValueError, TypeError) as error:
        msg = f"device list entry {index} ({entry!r}): {error}"
        raise type(error)(msg) from error
    if probe.always_resident:
        msg = (
            f"device list entry {index} ({entry!r}) is the host, which places nothing. List accelerators "
            "only; device='cpu' alone keeps every model on the host."
        )
        raise ValueError(msg)
    if isinstance(probe, DeviceProbe):
        device = probe.execution_device
        count = torch.get_device_module(device.type).device_count()
        if device.index is not None and device.index >= count:
            msg = (
                f"device list entry {index} ({entry!r}): this machine has {count} {device.type} device(s), "
                f"numbered from 0. Pick one of {[f'{device.type}:{i}' for i in range(count)]}."
            )
            raise ValueError(msg)
    return probe


def _shown(devices: Sequence[object]) -> str:
    return "[" + ", ".join(getattr(d, "name", None) or repr(d) for d in devices) + "]"
