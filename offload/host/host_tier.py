"""The host tier: keeps the host copies of an engine's models within a byte budget, with disk behind it.

Every attached model keeps a host copy (``offload.weights.ledger``). With a host budget, when the host copies
held exceed it, the models needed least soon (ranked as ``NextUseStrategy`` ranks device victims, from the
plan and the use history) drop theirs: their weights are then on disk, and read back when next placed. A
tensor is read back from the safetensors file the model was loaded from when that file holds the same
values; the others (a fused LoRA, an edited or new weight, a model built in memory, a quantized weight such
as torchao's, by its inner tensors) are written once to a spill folder (``offload.host.spill_files``: removed at
close or exit). Models on the device, running, or held for a reader of their weights (``hold``: a save, a
state dict, a fused LoRA) are never dropped. Every step is in the engine's log.

The engine calls a ``HostTier`` with its lock held. With several devices, each engine's tier holds a share
of one host budget (``offload.host.host_budget``); the manager sets it with ``set_share``, which takes that lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import attrs
import torch
from safetensors import SafetensorError

from offload.devices.probes import MemoryProbe
from offload.devices.storage import module_fingerprint, module_nbytes
from offload.devices.units import format_bytes, format_bytes_distinct, parse_bytes
from offload.errors import DiskCopyError, HostBudgetError
from offload.host.disk_copies import (
    DiskCopy,
    file_index,
    file_sources,
    missing_from_files,
    read_back,
    writable_folder,
    write_spill,
)
from offload.host.host_budget import HostShare, default_host_budget
from offload.host.spill_files import SpillFiles
from offload.host.tensor_slots import TensorSlot, drop_tensors, empty_tensors, tensor_slots
from offload.records.log import OffloadDecision, OffloadLog
from offload.records.messages import reload_hint
from offload.strategies.next_use import NextUseStrategy
from offload.strategies.strategy import OffloadRequest
from offload.weights.ledger import ResidencyLedger

__all__ = ["HostTier"]

logger = logging.getLogger("offload.engine.engine")


@attrs.define
class _Model:
    module: torch.nn.Module
    files: tuple[str, ...]  # the safetensors files it was loaded from
    size: int  # bytes of its host copy (meta tensors hold none)
    measured: int  # the ledger's size of it when ``size`` was measured
    kept: int = 0  # bytes that stay in host memory while it is on disk (DiskCopy.kept)
    index: dict | None = None  # the files' tensors, from their headers (read once, when first needed)
    copy: DiskCopy | None = None  # where its tensors can be read back from, once it was first dropped
    stale: bool = False  # its values changed since ``copy`` was made (refresh_host_copy)
    dropped: list[TensorSlot] | None = None  # the slots pointing at placeholders while on disk
    refusal: str | None = None  # why it cannot be dropped, until it changes


def _in_memory(model: _Model) -> int:
    """Bytes of ``model``'s host copy in host memory now: all of it, or only what stays while it is on disk."""
    return model.size if model.dropped is None else model.kept


class HostTier:
    """Holds the host copies of one engine's models within ``budget`` bytes; the rest are on disk.

    Args:
        probe: The engine's device (its free bytes go into the log).
        ledger: Which models are on the device.
        log: The engine's log.
        budget: Bytes (or ``"48GB"``) of host copies to hold; ``None`` for ``default_host_budget``.
        spill_folder: Where changed weights are written; ``None`` for a temporary folder, made when first
            needed. A folder given is made if missing and checked writable now. Its files go at ``close``.
        calls: How many calls of a model are in progress (a model in a call is never dropped).
        request: Builds the request a strategy ranks (``Placer.request``: the plan and the use history).
        lock: The engine's lock, taken by the calls made from outside the engine (``set_share``).

    Raises:
        HostBudgetError: the spill folder cannot be written.
        TypeError, ValueError: ``budget`` is not a size.
    """

    def __init__(
        self,
        probe: MemoryProbe,
        ledger: ResidencyLedger,
        log: OffloadLog,
        budget: int | str | None,
        spill_folder: str | os.PathLike | None,
        calls: Callable[[str], int],
        request: Callable[[str, int, int, dict[str, int]], OffloadRequest],
        lock: threading.RLock | None = None,
    ):
        self.budget = default_host_budget(0) if budget is None else parse_bytes(budget, name="host_budget")
        self.share: HostShare | None = None  # with several devices: this tier's share of the host budget
        self._lock = threading.RLock() if lock is None else lock
        self._probe = probe
        self._ledger = ledger
        self._log = log
        self._calls = calls
        self._request = request
        self._pin = probe.moves_weights and probe.execution_device.type == "cuda"
        self._models: dict[str, _Model] = {}
        # Running totals over ``_models``, kept by ``_change``, so that no placement walks every model.
        self._in_memory = 0  # held_bytes
        self._placed = 0  # placed_bytes
        self._placing: set[str] = set()  # read back and about to be placed: not dropped meanwhile
        self._held: Counter[str] = Counter()  # read back for a reader (``hold``): not dropped until released
        existed = spill_folder is not None and os.path.isdir(spill_folder)
        folder = None if spill_folder is None else writable_folder(os.fspath(spill_folder))
        self._spills = SpillFiles(self, folder, made=folder is not None and not existed)

    @property
    def spill_folder(self) -> str | None:
        """The folder changed weights are written to (``None`` until a temporary one is first needed)."""
        return self._spills.folder

    def held_bytes(self) -> int:
        """Bytes of the host copies in memory now."""
        return self._in_memory

    def on_disk(self, model_id: str) -> bool:
        """Whether ``model_id``'s host copy is dropped: its weights are on disk only."""
        model = self._models.get(model_id)
        return model is not None and model.dropped is not None

    def disk_nbytes(self, model_id: str) -> int:
        """Bytes of ``model_id``'s weights while they are on disk only; 0 while its host copy is held."""
        model = self._models.get(model_id)
        return model.size if model is not None and model.dropped is not None else 0

    def spill_files(self) -> dict[str, str]:
        """The spill file written for each model, by model id."""
        return self._spills.paths()

    def placed_bytes(self) -> int:
        """Bytes of the host copies of every model it keeps, held or on disk."""
        with self._lock:
            return self._placed

    # -- a share of a host budget split between devices ----------------------------------------
    def set_share(self, share: HostShare, drop: bool = True) -> None:
        """Hold ``share`` of a host budget split between devices from now on; with ``drop`` and a share
        smaller than the budget held so far, drop the least-needed copies now to fit it."""
        with self._lock:
            shrinks = share.nbytes < self.budget
            self.share, self.budget = share, share.nbytes
            if drop and shrinks:
                self._make_room("", 0)  # no model is being placed: rank them all by the plan's next uses

    def check_share(
        self, share: HostShare, modules: Mapping[str, torch.nn.Module], files: Mapping[str, Sequence[str]]
    ) -> None:
        """``check_fit`` of its models and of ``modules`` (to be attached) against ``share``, before it
        is set."""
        with self._lock:
            for model_id, model in self._models.items():  # a model on disk: its size when it was held
                self._check(model_id, model.module, model.files, model.size, share)
            for model_id, module in modules.items():
                size = module_nbytes(module, count_meta=False)
                self._check(model_id, module, files.get(model_id, ()), size, share)

    # -- attach / detach -----------------------------------------------------------------------
    def check_fit(self, modules: Mapping[str, torch.nn.Module], files: Mapping[str, Sequence[str]]) -> None:
        """Raise HostBudgetError if a model larger than the budget has no file to read all of it back from.

        Such a model is never held on the host for long; it can be read back only from a file written before
        it was dropped (its source file, unchanged), since a spill is written from a host copy the budget
        cannot hold. Checked from the files' headers (names, shapes, dtypes). With several devices, the
        tier's share is its budget, and the message says how it was split.
        """
        for model_id, module in modules.items():
            size = module_nbytes(module, count_meta=False)
            self._check(model_id, module, files.get(model_id, ()), size, self.share)

    def _check(
        self, model_id: str, module: torch.nn.Module, files: Sequence[str], size: int, share: HostShare | None
    ) -> None:
        if size <= (self.budget if share is None else share.nbytes):
            return
        gaps = missing_from_files(module, files)
        if gaps is None:
            return
        if share is not None:
            raise HostBudgetError(share.refusal(model_id, size, gaps))
        need, budget = format_bytes_distinct(size, self.budget)
        msg = (
            f"model {model_id!r} ({need}) is larger than host_budget {budget} and has {gaps.where} of its "
            f"weights to read back from ({gaps.missing}); it would have to be held in host memory beyond the "
            f"budget. Raise host_budget above its size, {reload_hint(gaps.quantized)}. Nothing was dropped."
        )
        raise HostBudgetError(msg)

    def attach(self, model_id: str, module: torch.nn.Module, files: Sequence[str]) -> None:
        """Keep ``module``'s host copy under the budget from now on; ``files`` are those it was loaded from."""
        size = module_nbytes(module, count_meta=False)
        self._forget(model_id)
        model = _Model(module, tuple(files), size, measured=self._ledger.nbytes(model_id))
        self._models[model_id] = model
        self._in_memory += _in_memory(model)
        self._placed += model.size

    def detach(self, model_id: str, read_back: bool = True) -> None:
        """Forget ``model_id`` (its spill file is removed). With ``read_back``, a model on disk is read back
        first (a file gone raises ``DiskCopyError`` with nothing changed); without, nothing is read: the
        tensors it holds on disk only become meta tensors (``empty_tensors``), so it leaves without them."""
        model = self._models.get(model_id)
        if read_back:
            self.restore(model_id)
        elif model is not None and model.dropped is not None:
            empty_tensors(model.dropped)
            logger.info("%s leaves with its weights on disk unread (meta tensors)", model_id)
        self._forget(model_id)  # a pinned model was never attached here
        self._held.pop(model_id, None)
        self._spills.forget(model_id)

    def close(self) -> None:
        """Remove the spill files, and the spill folder when this tier made it. Call after every detach.

        A tier never closed (a program that ends without ``disable_auto_cpu_offload()``) removes them at exit.
        """
        self._spills.close()

    # -- readers of the weights ----------------------------------------------------------------
    def hold(self, model_id: str) -> bool:
        """Read ``model_id`` back if it is on disk and keep its host copy until ``release``: for a reader of its
        weights (a save, ``state_dict``, an in-place change). Holds nest. Returns whether it is held (a model
        not kept here is not, and needs no ``release``).

        Raises:
            DiskCopyError: a file it reads is gone or was replaced (nothing held).
        """
        if model_id not in self._models:
            return False
        self._held[model_id] += 1
        try:
            self.restore(model_id)
        except BaseException:
            self.release(model_id, drop=False)
            raise
        return True

    def release(self, model_id: str, drop: bool = True) -> None:
        """End one ``hold``; with ``drop`` and no hold left, drop host copies until the budget holds again."""
        if self._held[model_id] <= 1:
            self._held.pop(model_id, None)
        else:
            self._held[model_id] -= 1
            return
        if drop:
            self._make_room("", 0)

    # -- placement -----------------------------------------------------------------------------
    @contextmanager
    def placing(self, model_id: str) -> Iterator[None]:
        """Around a placement of ``model_id``: first read it back if it is on disk (dropping others so that it
        fits the budget), and keep it from being dropped; after, drop host copies until the budget holds
        (models just evicted from the device may go now)."""
        self._placing.add(model_id)
        try:
            model = self._models.get(model_id)
            if model is not None and model.dropped is not None:
                self._make_room(model_id, model.size)
                self.restore(model_id)
            yield
        finally:
            self._placing.discard(model_id)
            measured = self._ledger.nbytes(model_id) if model_id in self._ledger else None  # None: detached
            if model is not None and model.dropped is None and measured not in (None, model.measured):
                # measured again by the placer
                self._change(model, size=module_nbytes(model.module, count_meta=False), measured=measured)
            self._make_room(model_id, 0)

    def changed(self, model_id: str) -> None:
        """``model_id``'s weights changed in place (``refresh_host_copy``): compare and spill again next time.

        Reads it back first if it is on disk, so that the change applies to real weights.
        """
        model = self._models.get(model_id)
        if model is None:
            return
        self.restore(model_id)
        model.stale = True
        model.refusal = None
        self._change(model, size=module_nbytes(model.module, count_meta=False))
        model.measured = self._ledger.nbytes(model_id)

    def restore(self, model_id: str) -> None:
        """Read ``model_id``'s weights back from disk into host memory; a no-op when they are there.

        Raises:
            DiskCopyError: a file it reads is gone or was replaced since it was dropped (nothing changed).
        """
        model = self._models.get(model_id)
        if model is None or model.dropped is None or model.copy is None:
            return
        changed = model.copy.changed_files()
        if changed:
            msg = (
                f"model {model_id!r} cannot be read back: its host copy was dropped under host_budget "
                f"{format_bytes(self.budget)} and {changed} is gone or was replaced since. Put the file back "
                "as it was, or remove the model (components_manager.remove(id): it leaves without its "
                "weights, nothing is read) and load it again."
            )
            raise DiskCopyError(msg)
        free = self._probe.free_bytes()
        read = read_back(model.dropped, model.copy, self._pin)
        self._change(model, dropped=None)
        self._record(model_id, "disk read", free, from_disk=read)

    # -- internals -----------------------------------------------------------------------------
    def _change(self, model: _Model, **fields: object) -> None:
        """Set ``fields`` of ``model`` (its ``size``, ``kept``, ``dropped``), keeping the running totals."""
        in_memory, size = _in_memory(model), model.size
        for name, value in fields.items():
            setattr(model, name, value)
        self._in_memory += _in_memory(model) - in_memory
        self._placed += model.size - size

    def _forget(self, model_id: str) -> None:
        model = self._models.pop(model_id, None)
        if model is not None:
            self._in_memory -= _in_memory(model)
            self._placed -= model.size

    def _make_room(self, model_id: str, extra: int) -> None:
        refused: set[str] = set()
        while True:
            excess = self.held_bytes() + extra - self.budget
            if excess <= 0:
                return
            candidates = {
                m: model.size
                for m, model in self._models.items()
                if m != model_id
                and m not in refused
                and m not in self._placing
                and m not in self._held
                and model.dropped is None
                and model.refusal is None
                and model.size > 0
                and not self._ledger.is_resident(m)
                and not self._calls(m)
            }
            if not candidates:
                return  # the rest is on the device or in use: the budget holds again once they leave it
            request = self._request(model_id, excess, 0, candidates)
            for victim in NextUseStrategy().select_victims(request):
                if not self._drop(victim):
                    refused.add(victim)

    def _drop(self, model_id: str) -> bool:
        model = self._models[model_id]
        slots = tensor_slots(model.module)
        if isinstance(slots, str):
            model.refusal = slots
            logger.info("%s keeps its host copy: %s", model_id, slots)
            return False
        if any(slot.tensor.device.type != "cpu" for slot in slots):
            return False  # part of it is on the device (a streamed model's resident groups): kept for now
        fingerprint = module_fingerprint(model.module)
        copy = model.copy
        keys = {slot.key for slot in slots}
        if (
            copy is None
            or model.stale
            or copy.fingerprint != fingerprint
            or set(copy.sources) | copy.kept != keys
        ):
            copy = self._disk_copy(model_id, model, slots, fingerprint)
            if copy is None:
                return False
        free = self._probe.free_bytes()
        dropped = [slot for slot in slots if slot.key not in copy.kept]
        drop_tensors(dropped)
        kept = sum(slot.nbytes for slot in slots if slot.key in copy.kept)
        self._change(model, kept=kept, dropped=dropped)
        model.copy, model.stale = copy, False
        self._record(model_id, "drop host copy", free)
        return True

    def _disk_copy(
        self, model_id: str, model: _Model, slots: list[TensorSlot], fingerprint: tuple[int, int, int]
    ) -> DiskCopy | None:
        """Where every tensor can be read back from: its source file, or a spill written now."""
        if model.index is None:
            model.index = file_index(model.files)
        sources = file_sources(slots, model.index)
        kept = frozenset(slot.key for slot in slots if slot.key not in sources and slot.non_persistent)
        spill = [slot for slot in slots if slot.key not in sources and slot.key not in kept]
        spilled = 0
        if spill:
            free = self._probe.free_bytes()
            path = self._spill_path(model_id)
            try:
                spilled = write_spill(path, spill)
            except (OSError, SafetensorError) as error:
                model.refusal = f"its spill file {path} could not be written ({error})"
                logger.warning("%s keeps its host copy: %s", model_id, model.refusal)
                return None
            self._spills.add(model_id, path)
            sources.update({slot.key: (path, slot.key) for slot in spill})
            self._record(model_id, "spill", free, to_disk=spilled)
        copy = DiskCopy(sources=sources, spilled=spilled, fingerprint=fingerprint, kept=kept)
        copy.stamp()
        return copy

    def _spill_path(self, model_id: str) -> str:
        return self._spills.path_for(model_id, id(self._models[model_id]))

    def _record(self, model_id: str, reason: str, free: int, from_disk: int = 0, to_disk: int = 0) -> None:
        free_after = self._probe.free_bytes()
        self._log.append(
            OffloadDecision(
                time=time.time(),
                model_id=model_id,
                evicted=(),
                bytes_to_device=0,
                bytes_to_host=0,
                free_before=free,
                free_after=free_after,
                reason=reason,
                bytes_from_disk=from_disk,
                bytes_to_disk=to_disk,
            )
        )
