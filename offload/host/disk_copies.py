"""A model's weights on disk: where each tensor can be read back from, spill files, and reading back.

A model's host copy is dropped by pointing every weight at a placeholder that holds one element
(``offload.host.tensor_slots``; the Parameter objects stay, so references to them, the ledger's fingerprint
and the hook stay valid), and read
back by pointing them at tensors read from safetensors files (``safe_open`` maps the file). A tensor is read
back from the file the model was loaded from when the file holds it under one of its names, with the same
shape and dtype, and the same values (checked once, when the model is first dropped); every other tensor
is written once to a spill file.

A wrapper tensor subclass (a quantized weight: torchao's ``Int8Tensor``, ``is_traceable_wrapper_subclass``)
is dropped by its inner plain tensors, each spilled under ``<name>.<inner name>``. They are never read from
the source file, which holds the unquantized weights.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from offload.errors import HostBudgetError
from offload.host.tensor_slots import TensorSlot, assign, tensor_slots

__all__ = [
    "DiskCopy",
    "FileGaps",
    "file_identity",
    "file_index",
    "file_sources",
    "missing_from_files",
    "read_back",
    "writable_folder",
    "write_spill",
]

# safetensors' dtype names (the header's "dtype" field). safetensors.torch keeps its own map private.
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@attrs.define
class DiskCopy:
    """Where each tensor of one model can be read back from: ``sources[slot key] = (path, key in the file)``.

    Attributes:
        sources: The file and key of every tensor that is not a meta tensor.
        spilled: Bytes of it written to the spill file (0 when everything is read from the source files).
        fingerprint: ``module_fingerprint`` of the model when the copy was made; a copy is valid only while
            the model has the same one and was not refreshed since.
        stamps: The identity of every file it reads (``file_identity``), so a file replaced since is refused.
        kept: Keys of the tensors that stay in host memory: non-persistent buffers the files lack (position
            ids, rotary tables: small, and made by the model, not loaded), so an unchanged model spills nothing.
    """

    sources: dict[str, tuple[str, str]]
    spilled: int
    fingerprint: tuple[int, int, int]
    kept: frozenset[str] = frozenset()
    stamps: dict[str, tuple[int, ...]] = attrs.field(factory=dict)

    def stamp(self) -> None:
        """Record the identity of every file the copy reads."""
        for path in {path for path, _ in self.sources.values()}:
            self.stamps[path] = file_identity(os.stat(path))

    def changed_files(self) -> list[str]:
        """The files the copy reads that are gone or were replaced since ``stamp``."""
        changed = []
        for path, stamp in self.stamps.items():
            try:
                status = os.stat(path)
            except OSError:
                changed.append(path)
                continue
            if file_identity(status) != stamp:
                changed.append(path)
        return changed


def file_identity(status: os.stat_result) -> tuple[int, ...]:
    """What tells a file from one put in its place: device, inode, size, modification and change time.

    Size and modification time alone miss a file of the same size replaced by ``cp -p``, ``rsync -t`` or ``tar
    x``, which set the modification time back. A replacement renamed into place (rsync, tar) has another
    inode; one written over the old file (``cp -p``) keeps the inode but not the change time, which no tool
    sets back. A ``chmod`` or a new hard link also changes the change time: such a file counts as replaced
    (refused, never read silently).
    """
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def file_index(paths: Iterable[str]) -> dict[str, tuple[str, tuple[int, ...], torch.dtype | None]]:
    """``{key: (path, shape, dtype)}`` of the tensors stored in safetensors files, from their headers only.

    A key in several files keeps the first; a file that cannot be read is skipped (its tensors then spill).
    """
    index: dict[str, tuple[str, tuple[int, ...], torch.dtype | None]] = {}
    for path in paths:
        try:
            with safe_open(path, framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - a safe_open handle is not a mapping
                    view = handle.get_slice(key)
                    index.setdefault(key, (path, tuple(view.get_shape()), _DTYPES.get(view.get_dtype())))
        except (OSError, ValueError, RuntimeError):
            continue
    return index


@attrs.frozen
class FileGaps:
    """What of a model its files cannot give back (:func:`missing_from_files`), for a host-budget refusal.

    Attributes:
        where: which files, as the message says it: ``"no safetensors file it was loaded from"``, ``"files
            that lack some"`` or ``"no file holding the quantized form"``.
        missing: the first names missing (or why it cannot be stored at all).
        quantized: it holds quantized weights, which no file gives back (its file holds the weights before
            quantization): the fix the refusal offers is not "load it from a saved file".
    """

    where: str
    missing: str
    quantized: bool = False


def missing_from_files(module: torch.nn.Module, files: Sequence[str]) -> FileGaps | None:
    """What of ``module`` its safetensors ``files`` lack, from their headers (names, shapes, dtypes); ``None``
    when they store every tensor of it (non-persistent buffers aside).

    Returns:
        The files' gaps (:class:`FileGaps`), ``None`` when there are none.
    """
    slots = tensor_slots(module)
    index = file_index(files)
    quantized = False
    if isinstance(slots, str):
        missing = [slots]
    else:
        quantized = any(slot.holders and not slot.non_persistent for slot in slots)
        missing = [
            slot.key
            for slot in slots
            if not slot.non_persistent
            and (slot.holders or not any(_stored(index, n, slot.tensor) for n in slot.names))
        ]
    if not missing:
        return None
    where = "no safetensors file it was loaded from" if not index else "files that lack some"
    where = "no file holding the quantized form" if quantized else where
    shown = ", ".join(missing[:3])
    return FileGaps(where, shown if len(missing) <= 3 else f"{shown} and {len(missing) - 3} more", quantized)


def _stored(index: dict, name: str, tensor: torch.Tensor) -> bool:
    found = index.get(name)
    return found is not None and found[1] == tuple(tensor.shape) and found[2] == tensor.dtype


def file_sources(
    slots: Sequence[TensorSlot], index: dict[str, tuple[str, tuple[int, ...], torch.dtype | None]]
) -> dict[str, tuple[str, str]]:
    """``{slot key: (path, key in the file)}`` for the slots a file of ``index`` stores with the same values.

    A slot matches under any of its names with the same shape and dtype; its values are then compared with
    the file's (each file is opened once), so a weight changed in place since loading does not match. An
    inner tensor of a wrapper subclass never matches (the file holds the weight before it was quantized).
    """
    candidates: dict[str, list[tuple[TensorSlot, str]]] = {}
    for slot in slots:
        for name in [] if slot.holders else slot.names:
            found = index.get(name)
            if found is not None and found[1] == tuple(slot.tensor.shape) and found[2] == slot.tensor.dtype:
                candidates.setdefault(found[0], []).append((slot, name))
                break
    sources = {}
    for path, pairs in candidates.items():
        with safe_open(path, framework="pt") as handle:
            for slot, name in pairs:
                if torch.equal(handle.get_tensor(name), slot.tensor):
                    sources[slot.key] = (path, name)
    return sources


def write_spill(path: str, slots: Sequence[TensorSlot]) -> int:
    """Write ``slots`` to the safetensors file ``path`` (whole, or not at all). Returns the bytes written.

    Raises:
        OSError, SafetensorError: the file cannot be written.
    """
    tensors = {slot.key: slot.tensor.contiguous() for slot in slots}
    partial = f"{path}.partial"
    try:
        # Made again if gone: an engine replaced by one on the same folder removes it when left empty.
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_file(tensors, partial)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return sum(slot.nbytes for slot in slots)


def read_back(slots: Sequence[TensorSlot], copy: DiskCopy, pin: bool) -> int:
    """Point every slot at its tensor read from disk (pinned when ``pin``). Returns the bytes read."""
    by_path: dict[str, list[TensorSlot]] = {}
    for slot in slots:
        by_path.setdefault(copy.sources[slot.key][0], []).append(slot)
    read = 0
    for path, group in by_path.items():
        with safe_open(path, framework="pt", device="cpu") as handle:
            for slot in group:
                assign(slot, _laid_out(handle.get_tensor(copy.sources[slot.key][1]), slot.stride, pin))
                read += slot.nbytes
    return read


def _laid_out(tensor: torch.Tensor, stride: tuple[int, ...], pin: bool) -> torch.Tensor:
    """``tensor`` (read contiguous) with ``stride`` when that is a dense layout (a transposed weight, or a
    quantized one's packed data: kernels may rely on it), pinned when ``pin``."""
    if tensor.stride() == stride or not _dense(tuple(tensor.shape), stride):
        return tensor.pin_memory() if pin else tensor
    strided = torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, pin_memory=pin)
    return strided.copy_(tensor)


def _dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    # Every element of one block of memory once: strides, smallest first, are the running products of sizes.
    expected = 1
    for size, step in sorted(zip(shape, stride, strict=True), key=lambda pair: pair[1]):
        if size == 1:
            continue
        if step != expected:
            return False
        expected *= size
    return True


def writable_folder(folder: str) -> str:
    """``folder``, made if missing, once a file could be written in it.

    Raises:
        HostBudgetError: it cannot be made or written to.
    """
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        msg = (
            f"spill_folder {folder!r} is not a writable folder ({error}). Pass a folder you can write to, or "
            "leave spill_folder unset for a temporary one. Nothing was dropped."
        )
        raise HostBudgetError(msg) from error
    return folder
