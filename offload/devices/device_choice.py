"""Which device each model goes to when auto offload runs on several devices.

Each model is placed by the engine of one device for as long as it is attached; a *device choice* rule
picks that device when the model is attached (all models registered at ``enable_auto_cpu_offload`` at
once, a model added later alone). A rule is any object with ``choose_devices(models, devices)``: a
strategy that has that method supplies the rule too, else ``DenoiserFirst`` decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from offload.devices.units import format_bytes
from offload.errors import StrategyError

__all__ = ["DenoiserFirst", "DeviceChoice", "DeviceRoom", "check_choice", "device_choice_of"]


@attrs.frozen
class DeviceRoom:
    """One device as a device-choice rule sees it.

    Attributes:
        index: Its position in the device list.
        name: Its short name, e.g. ``"cuda:1"`` or a ``SimulatedDevice``'s name.
        capacity: Bytes it can give weights: its total (free memory when unknown) less the margin.
        assigned: Bytes of the models already placed by its engine.
    """

    index: int
    name: str
    capacity: int
    assigned: int = 0

    @property
    def room(self) -> int:
        """Capacity not yet taken by the models assigned to it (negative when they overfill it)."""
        return self.capacity - self.assigned


@runtime_checkable
class DeviceChoice(Protocol):
    """A rule that gives each model a device."""

    def choose_devices(self, models: Mapping[str, int], devices: Sequence[DeviceRoom]) -> Mapping[str, int]:
        """Map each model id of ``models`` (``{id: bytes}``, to be attached now) to a ``DeviceRoom.index``."""
        ...


class DenoiserFirst:
    """The default rule: the largest model (the denoiser) where there is the most room, the others beside it.

    Models are taken largest first. The first goes to the device with the most room; each next one goes
    beside it when it fits in what is left there, else to the next device on (in list order, wrapping)
    where it fits, else to the device with the most room left, whose engine then offloads as on one device.
    So the models that feed the denoiser run beside it while they fit, and a model added later goes where
    there is the most room.
    """

    def __repr__(self) -> str:
        return "DenoiserFirst()"

    def choose_devices(self, models: Mapping[str, int], devices: Sequence[DeviceRoom]) -> dict[str, int]:
        room = {device.index: device.room for device in devices}
        ring = [device.index for device in devices]
        chosen: dict[str, int] = {}
        home: int | None = None
        for model_id in sorted(models, key=lambda m: -models[m]):  # stable: registration order on ties
            nbytes = models[model_id]
            most_room = max(ring, key=room.__getitem__)
            if home is None:
                home = index = most_room
            else:
                start = ring.index(home)
                onward = ring[start:] + ring[:start]
                index = next((i for i in onward if room[i] >= nbytes), most_room)
            chosen[model_id] = index
            room[index] -= nbytes
        return chosen


def device_choice_of(strategy: object) -> DeviceChoice:
    """The strategy itself when it has ``choose_devices``, else ``DenoiserFirst()``."""
    return strategy if isinstance(strategy, DeviceChoice) else DenoiserFirst()


def check_choice(
    rule: DeviceChoice, models: Mapping[str, int], devices: Sequence[DeviceRoom]
) -> dict[str, int]:
    """Ask ``rule`` for the devices of ``models`` and check its answer before anything is attached.

    Raises:
        StrategyError: the answer is not a mapping, leaves a model out, names one it was not asked
            about, or gives a device index not in ``devices``.
    """
    answer = rule.choose_devices(dict(models), tuple(devices))
    indexes = [device.index for device in devices]
    if not isinstance(answer, Mapping):
        msg = f"{rule!r}.choose_devices returned {answer!r}; it must map each model id to a device index."
        raise StrategyError(msg)
    missing = [m for m in models if m not in answer]
    extra = [m for m in answer if m not in models]
    bad = {
        m: i for m, i in answer.items() if isinstance(i, bool) or not isinstance(i, int) or i not in indexes
    }
    if missing or extra or bad:
        rooms = ", ".join(f"{d.index}: {d.name} ({format_bytes(d.room)} free)" for d in devices)
        msg = (
            f"{rule!r}.choose_devices must map each model id of {list(models)} to a device index among "
            f"{{{rooms}}}; missing {missing}, not asked about {extra}, bad indexes {bad}."
        )
        raise StrategyError(msg)
    return {model_id: answer[model_id] for model_id in models}
