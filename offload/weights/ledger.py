"""The residency ledger: which models are on the device, their sizes, and the host copy of each.

Every attached model keeps its weights on the host; that host copy is retained while the model is
resident, so eviction only points the parameters back at it and drops the device copy: zero bytes
move device-to-host. On CUDA the host copy is pinned once, at attach, so uploads are fast and
asynchronous. The tensors move in ``offload.weights.weight_moves``; the ledger decides when and counts the
bytes. With a bookkeeping probe (simulated device, CPU) nothing moves; only bytes are counted.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import attrs
import torch

from offload.devices.probes import MemoryProbe
from offload.devices.storage import module_fingerprint, module_nbytes
from offload.weights.changes import install_registration_counter, registrations, unwatch, watch
from offload.weights.pinned import pinned_device_bytes
from offload.weights.weight_moves import HostCopies, WeightMoves

__all__ = ["ResidencyLedger"]

logger = logging.getLogger(__name__)


@attrs.define
class _Entry:
    module: torch.nn.Module
    nbytes: int
    resident: bool = False
    copies: HostCopies = attrs.field(factory=HostCopies)  # its host tensors set aside while on the device
    # What the weights looked like when last measured, and the registration count read just before.
    fingerprint: tuple[int, int, int] = (0, 0, 0)
    generation: int = -1
    watched: list[torch.nn.Module] = attrs.field(factory=list)  # its submodules, watched for registrations
    # Partly resident (offload.partial.streaming): bytes of its resident groups, and bytes it holds on the device
    # (those plus the room its streamed groups pass through). None when whole or off the device.
    prefix: int | None = None
    footprint: int | None = None
    # Pinned (offload.weights.pinned): never moved; the bytes it holds on the device, else None.
    pinned: int | None = None
    serial: int = 0  # its place in the order models were added (``residents`` keeps that order)


def _shrunk(entry: _Entry) -> int | None:
    """Bytes of ``entry``'s resident prefix if it was shrunk to one (``drop_tail``: its tail off the device, no
    room held for streaming it), else None. A streaming model holds room for its groups beyond its prefix."""
    if entry.resident and entry.footprint is not None and entry.footprint == entry.prefix:
        return entry.prefix
    return None


def _held(entry: _Entry) -> int:
    """Bytes ``entry`` holds on the device when resident."""
    return entry.nbytes if entry.footprint is None else entry.footprint


class ResidencyLedger:
    """What is resident on one probe's device, with byte sizes from the real storage.

    Args:
        probe: The device the ledger places weights on.
    """

    def __init__(self, probe: MemoryProbe):
        self.probe = probe
        self._entries: dict[str, _Entry] = {}
        # Indexes kept as entries change, so that no query walks every attached model: the resident ones
        # (pinned ones apart), the pinned ones, and each module's id (by ``id(module)``).
        self._resident: dict[str, _Entry] = {}
        self._pinned: dict[str, _Entry] = {}
        self._ids: dict[int, str] = {}
        self._serials = itertools.count()
        self._resident_bytes = 0
        self.peak_resident_bytes = 0
        # None for a bookkeeping probe (simulated device, CPU): nothing moves, only bytes are counted.
        self._moves = (
            WeightMoves(probe.execution_device, pin=probe.execution_device.type == "cuda")
            if probe.moves_weights
            else None
        )
        install_registration_counter()

    # -- queries -------------------------------------------------------------------------------
    def __contains__(self, model_id: str) -> bool:
        return model_id in self._entries

    def ids(self) -> list[str]:
        """Every model id in the ledger, in the order they were added."""
        return list(self._entries)

    def module(self, model_id: str) -> torch.nn.Module:
        """The module registered under ``model_id``."""
        return self._entries[model_id].module

    def id_of(self, module: torch.nn.Module) -> str | None:
        """The id ``module`` (the very object) is registered under, or ``None``."""
        return self._ids.get(id(module))

    def nbytes(self, model_id: str) -> int:
        """Bytes of ``model_id``'s weights (unique storages of parameters and buffers)."""
        return self._entries[model_id].nbytes

    def is_resident(self, model_id: str) -> bool:
        """True if ``model_id`` is on the device now."""
        entry = self._entries.get(model_id)
        return entry is not None and entry.resident

    def residents(self) -> dict[str, int]:
        """Resident model ids and the bytes each holds on the device (its footprint when partly resident), in
        the order the models were added."""
        resident = sorted(self._resident.items(), key=lambda item: item[1].serial)
        return {mid: _held(e) for mid, e in resident}

    def is_pinned(self, model_id: str) -> bool:
        """True if ``model_id`` is pinned: it stays where it is (``offload.weights.pinned``)."""
        entry = self._entries.get(model_id)
        return entry is not None and entry.pinned is not None

    def pinned(self) -> dict[str, int]:
        """Pinned model ids and the bytes each holds on the device (never among ``residents``)."""
        return {mid: e.pinned for mid, e in self._pinned.items() if e.pinned is not None}

    def partial(self, model_id: str) -> tuple[int, int] | None:
        """``(resident bytes, footprint)`` of a partly resident model (``offload.partial.streaming``), else None."""
        entry = self._entries.get(model_id)
        if entry is None or not entry.resident or entry.prefix is None or entry.footprint is None:
            return None
        return entry.prefix, entry.footprint

    def shrunk_prefix(self, model_id: str) -> int | None:
        """Bytes of ``model_id``'s resident prefix if it was shrunk (``offload.partial.shrink``), else None."""
        entry = self._entries.get(model_id)
        return None if entry is None else _shrunk(entry)

    def resident_bytes(self) -> int:
        """Bytes of all resident models."""
        return self._resident_bytes

    # -- changes -------------------------------------------------------------------------------
    def add(self, model_id: str, module: torch.nn.Module, pinned: bool = False) -> int:
        """Register ``module`` with its weights on the host (pinned on CUDA). Returns device-to-host bytes.

        A module whose weights sit on an accelerator is copied to the host once, here. A ``pinned`` one stays
        where it is and counts as resident from now on, outside ``residents`` (``offload.weights.pinned``).
        """
        generation = registrations()
        entry = _Entry(module=module, nbytes=module_nbytes(module), serial=next(self._serials))
        if pinned:
            entry.pinned, entry.resident = pinned_device_bytes(self.probe, module), True
            self._measured(entry, generation)
            self._entries[model_id] = self._pinned[model_id] = entry
            self._ids[id(module)] = model_id
            self.probe.on_resident(model_id, entry.pinned)
            return 0
        moved_back = self._moves.to_host(module) if self._moves is not None else 0
        self._measured(entry, generation)
        self._entries[model_id] = entry
        self._ids[id(module)] = model_id
        if self.probe.always_resident:
            self._set_resident(model_id, entry, True)
        return moved_back

    def remove(self, model_id: str) -> None:
        """Evict ``model_id`` if resident and forget it; its weights stay on the host copy."""
        if self._entries[model_id].pinned is not None:
            self.probe.on_evicted(model_id)
        elif self._entries[model_id].resident:
            self.evict(model_id)
        entry = self._entries.pop(model_id)
        self._resident.pop(model_id, None)  # always resident (device="cpu"): evict leaves it
        self._pinned.pop(model_id, None)
        self._ids.pop(id(entry.module), None)
        unwatch(entry.watched)

    def make_resident(
        self, model_id: str, part: tuple[Sequence[torch.nn.Module], int, int] | None = None
    ) -> int:
        """Put ``model_id`` on the device. Returns host-to-device bytes (0 if already resident).

        ``part`` puts only some of it there (``offload.partial.streaming``): the modules whose own tensors move, their
        bytes, and the footprint the model then holds (those bytes plus room for its streamed groups).
        """
        entry = self._entries[model_id]
        if part is None and _shrunk(entry) is not None:
            return self._complete(model_id, entry)  # shrunk to a prefix (drop_tail): its tail comes back
        if entry.resident:
            return 0
        if self._moves is not None:
            self._moves.upload(entry.module, entry.copies, None if part is None else part[0])
        entry.prefix, entry.footprint = (None, None) if part is None else part[1:]
        self._set_resident(model_id, entry, True)
        return entry.nbytes if part is None else part[1]

    def drop_tail(self, model_id: str, tail: Sequence[torch.nn.Module], prefix: int) -> int:
        """Take the own tensors of ``tail`` (modules of a resident whole model) off the device and keep the
        rest, ``prefix`` bytes, resident (``offload.partial.shrink``); ``make_resident`` brings the tail back. Returns
        device-to-host bytes: 0 unless tail weights changed on the device without ``refresh``."""
        entry = self._entries[model_id]
        copied = self._moves.drop_owners(entry.copies, tail) if self._moves is not None else 0
        self._resident_bytes -= _held(entry) - prefix
        entry.prefix = entry.footprint = prefix
        self.probe.on_resident(model_id, prefix)
        return copied

    def upload_group(self, model_id: str, owners: Sequence[torch.nn.Module]) -> None:
        """Put the own tensors of ``owners``, a streamed group of partly resident ``model_id``, on the device in
        the room its footprint holds (``offload.partial.streaming``); ``drop_group`` points them back at the host."""
        if self._moves is not None:
            entry = self._entries[model_id]
            self._moves.upload(entry.module, entry.copies, owners)

    def drop_group(self, model_id: str, owners: Sequence[torch.nn.Module]) -> int:
        """Point a streamed group's tensors back at their host copies. Returns device-to-host bytes: 0 unless
        its weights were replaced on the device meanwhile."""
        if self._moves is None:
            return 0
        return self._moves.drop_owners(self._entries[model_id].copies, owners)

    def _complete(self, model_id: str, entry: _Entry) -> int:
        prefix = entry.prefix or 0
        if self._moves is not None:
            self._moves.upload(entry.module, entry.copies)  # only the tensors not on the device move
        self._resident_bytes += entry.nbytes - prefix
        entry.prefix = entry.footprint = None
        self.peak_resident_bytes = max(self.peak_resident_bytes, self._resident_bytes)
        self.probe.on_resident(model_id, entry.nbytes)
        return entry.nbytes - prefix

    def evict(self, model_id: str) -> int:
        """Take ``model_id`` off the device. Returns device-to-host bytes: 0 unless weights changed on the
        device without ``refresh`` (then they are copied back so nothing is lost)."""
        entry = self._entries[model_id]
        if not entry.resident or self.probe.always_resident or entry.pinned is not None:
            return 0
        copied = self._moves.drop(entry.module, entry.copies) if self._moves is not None else 0
        self._set_resident(model_id, entry, False)
        return copied

    def changed(self, model_id: str) -> bool:
        """True if ``model_id``'s weights were added, removed, swapped or resized since it was measured.

        One integer comparison unless a submodule of an attached model registered a parameter, buffer or
        submodule since the last check (``offload.weights.changes``); then one walk of the model
        (``module_fingerprint``). Removals (``del``) register nothing and are seen at the next check that
        walks, or at ``refresh``.
        """
        entry = self._entries[model_id]
        generation = registrations()
        if generation == entry.generation:
            return False
        if self._fingerprint(entry) != entry.fingerprint:
            return True
        entry.generation = generation
        return False

    def refresh(self, model_id: str) -> int:
        """Re-read ``model_id``'s size and bring its host copy up to date. Returns device-to-host bytes."""
        entry = self._entries[model_id]
        generation = registrations()
        copied = 0
        if entry.pinned is not None:  # no host copy: measured where it is
            entry.nbytes, entry.pinned = (
                module_nbytes(entry.module),
                pinned_device_bytes(self.probe, entry.module),
            )
            self.probe.on_resident(model_id, entry.pinned)
            self._measured(entry, generation)
            return 0
        if self._moves is not None:
            copied = (
                self._moves.sync_host(entry.module, entry.copies)
                if entry.resident
                else self._moves.to_host(entry.module)
            )
        nbytes = module_nbytes(entry.module)
        if entry.resident and entry.footprint is None:  # a partly resident one keeps its footprint
            self._resident_bytes += nbytes - entry.nbytes
            self.probe.on_resident(model_id, nbytes)
            self.peak_resident_bytes = max(self.peak_resident_bytes, self._resident_bytes)
        entry.nbytes = nbytes
        self._measured(entry, generation)
        return copied

    # -- internals -----------------------------------------------------------------------------
    def _measured(self, entry: _Entry, generation: int) -> None:
        """Remember what ``entry``'s weights look like now; ``generation`` was read before looking."""
        watched = list(entry.module.modules())
        watch(watched)
        unwatch(entry.watched)
        entry.watched = watched
        entry.fingerprint, entry.generation = self._fingerprint(entry), generation

    def _fingerprint(self, entry: _Entry) -> tuple[int, int, int]:
        # A Parameter that WeightMoves.upload put in a slot stands for the original kept as the host copy.
        return module_fingerprint(entry.module, entry.copies.substitutes())

    def _set_resident(self, model_id: str, entry: _Entry, resident: bool) -> None:
        entry.resident = resident
        if resident:
            self._resident[model_id] = entry
            self._resident_bytes += _held(entry)
            self.peak_resident_bytes = max(self.peak_resident_bytes, self._resident_bytes)
            self.probe.on_resident(model_id, _held(entry))
        else:
            del self._resident[model_id]
            self._resident_bytes -= _held(entry)
            entry.prefix = entry.footprint = None
            self.probe.on_evicted(model_id)
