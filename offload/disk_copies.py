"""A model's weights on disk: where each tensor can be read back from, spill files, dropping and reading back.

A model's host copy is dropped by pointing every weight at a placeholder that holds one element (the
Parameter objects stay, so references to them, the ledger's fingerprint and the hook stay valid), and read
back by pointing them at tensors read from safetensors files (``safe_open`` maps the file). A tensor is read
back from the file the model was loaded from when the file holds it under one of its names, with the same
shape and dtype, and the same values (checked once, when the model is first dropped); every other tensor
is written once to a spill file.

A wrapper tensor subclass (a quantized weight: torchao's ``Int8Tensor``, ``is_traceable_wrapper_subclass``)
is dropped by its inner plain tensors (``__tensor_flatten__``, recursively), each spilled under
``<name>.<inner name>``: the wrapper object stays in its slot and only its inner attributes point at
placeholders, so its type, context, size and stride stay in memory. They are never read from the source
file, which holds the unquantized weights.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils._python_dispatch import TraceableWrapperSubclass, is_traceable_wrapper_subclass

from offload.errors import HostBudgetError

__all__ = [
    "DiskCopy",
    "FileGaps",
    "TensorSlot",
    "drop_tensors",
    "empty_tensors",
    "file_identity",
    "file_index",
    "file_sources",
    "missing_from_files",
    "read_back",
    "tensor_slots",
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
class TensorSlot:
    """One tensor of a model and every slot that holds it (tied weights share one).

    Attributes:
        key: Its first qualified name; the key in a spill file.
        names: Every qualified name it has (a source file may store a tied weight under any of them).
        places: ``(owner module, attribute name, is a parameter)`` for every slot holding it (for an inner
            tensor: every slot holding its wrapper).
        tensor: The tensor now (a placeholder while the model is dropped).
        holders: For an inner tensor of wrapper subclasses: ``(wrapper, inner attribute name)`` of each
            wrapper holding it; these attributes are set instead of the ``places``.
        stride: Its stride when found, restored at read back (a file stores it contiguous).
    """

    key: str
    names: list[str]
    places: list[tuple[torch.nn.Module, str, bool]]
    tensor: torch.Tensor
    holders: list[tuple[object, str]] = attrs.field(factory=list)
    stride: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda slot: tuple(slot.tensor.stride()), takes_self=True)
    )

    @property
    def nbytes(self) -> int:
        """Bytes of its values."""
        return self.tensor.numel() * self.tensor.element_size()

    @property
    def non_persistent(self) -> bool:
        """Whether every slot holding it is a non-persistent buffer (left out of the model's state dict)."""
        return all(
            not is_param and name in owner._non_persistent_buffers_set
            for owner, name, is_param in self.places
        )


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


# ``(qualified name, plain tensor, (the wrapper holding it, its attribute) or None for a module's own)``
_Leaf = tuple[str, torch.Tensor, tuple[object, str] | None]


def tensor_slots(module: torch.nn.Module) -> list[TensorSlot] | str:
    """The tensors of ``module`` that hold host memory, each once, or why they cannot be dropped.

    Meta tensors hold nothing and are left out. A wrapper subclass counts by its inner plain tensors. Returns
    a reason (a string) when a tensor is neither a plain strided tensor nor such a wrapper (safetensors
    cannot store it), or two tensors are different views of one storage (reading them back apart would
    double the memory and break the view).
    """
    slots: dict[object, TensorSlot] = {}  # by tensor object, and by view of a storage
    storages: dict[int, tuple] = {}  # storage pointer -> the one view of it that is used
    for prefix, owner in module.named_modules(remove_duplicate=False):
        entries = [(n, t, True) for n, t in owner._parameters.items()]
        entries += [(n, t, False) for n, t in owner._buffers.items()]
        for name, tensor, is_param in entries:
            if tensor is None or tensor.device.type == "meta":
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            leaves: list[_Leaf] | str
            if is_traceable_wrapper_subclass(tensor):
                leaves = _inner_tensors(tensor, qualified)
            else:
                leaves = [(qualified, tensor.data if is_param else tensor, None)]
            if isinstance(leaves, str):
                return leaves
            for key, data, holder in leaves:
                if type(data) is not torch.Tensor or data.layout != torch.strided:
                    return f"{key} is a {type(data).__name__} ({data.layout}), which safetensors cannot store"
                if data.device.type == "meta":
                    continue
                identity = id(tensor) if holder is None else id(data)  # ``.data`` is a new object each time
                slot = slots.get(identity)
                if slot is None:
                    pointer = data.untyped_storage().data_ptr()
                    view: tuple = (pointer, data.storage_offset(), data.shape, data.stride(), data.dtype)
                    view += (holder is None,)  # never one slot for an inner and a plain tensor (_assign)
                    if pointer == 0:  # an empty tensor has no storage to share
                        view = ("empty", identity)
                    elif storages.setdefault(pointer, view) != view:
                        return f"{key} is one of several different views of one storage"
                    slot = slots.get(view)
                    if slot is None:  # a tensor object tied to another one by its data is the same slot
                        slot = slots[view] = TensorSlot(key=key, names=[], places=[], tensor=data)
                    slots[identity] = slot
                if key not in slot.names:
                    slot.names.append(key)
                if not any(o is owner and n == name for o, n, _ in slot.places):
                    slot.places.append((owner, name, is_param))
                if holder is not None and not any(w is holder[0] and a == holder[1] for w, a in slot.holders):
                    slot.holders.append(holder)
    unique = {id(slot): slot for slot in slots.values()}
    return list(unique.values())


def _inner_tensors(wrapper: TraceableWrapperSubclass, key: str) -> list[_Leaf] | str:
    """``(key, inner tensor, (its wrapper, attribute))`` for the inner tensors of a wrapper subclass, nested
    wrappers flattened, or why one cannot be set apart from its wrapper."""
    names, _ = wrapper.__tensor_flatten__()
    leaves: list[_Leaf] = []
    for attribute in names:
        inner = getattr(wrapper, attribute)
        if attribute not in vars(wrapper):  # a property, say: there is no attribute to point elsewhere
            return f"{key} is a {type(wrapper).__name__} whose {attribute} is not a plain attribute"
        if is_traceable_wrapper_subclass(inner):
            nested = _inner_tensors(inner, f"{key}.{attribute}")
            if isinstance(nested, str):
                return nested
            leaves += nested
        else:
            leaves.append((f"{key}.{attribute}", inner, (wrapper, attribute)))
    return leaves


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


def _placeholder(tensor: torch.Tensor) -> torch.Tensor:
    # One element broadcast to the shape: the slot keeps its shape, dtype and device for the fingerprint and
    # for readers of the module, and holds no memory. NaN where the dtype has it, so a forward that bypasses
    # the hook gives NaN rather than plausible numbers.
    fill = float("nan") if tensor.is_floating_point() or tensor.is_complex() else 0
    return torch.full((), fill, dtype=tensor.dtype, device=tensor.device).expand(tensor.shape)


def _assign(slot: TensorSlot, tensor: torch.Tensor) -> None:
    # A wrapper subclass has no working ``.data`` setter; a new Parameter in its slot would change the identity
    # the ledger's fingerprint, the hook and the user's references rely on. So the wrapper object stays, and
    # only its inner attribute points elsewhere.
    for wrapper, attribute in slot.holders:
        setattr(wrapper, attribute, tensor)
    for owner, name, is_param in [] if slot.holders else slot.places:
        if is_param:
            param = owner._parameters[name]
            assert param is not None  # tensor_slots found a Parameter in this slot
            param.data = tensor
        else:
            owner._buffers[name] = tensor
    slot.tensor = tensor


def drop_tensors(slots: Sequence[TensorSlot]) -> None:
    """Point every slot at a placeholder; the values are freed once nothing else refers to them."""
    for slot in slots:
        _assign(slot, _placeholder(slot.tensor))


def empty_tensors(slots: Sequence[TensorSlot]) -> None:
    """Point every slot at a meta tensor of its shape, stride and dtype: a model that leaves without its
    weights holds no placeholder that computes NaN; any use of it fails loudly (``Tensor on device meta``)."""
    for slot in slots:
        tensor = slot.tensor
        empty = torch.empty_strided(tensor.shape, slot.stride, dtype=tensor.dtype, device="meta")
        if slot.holders:
            _assign(slot, empty)
            continue
        for owner, name, is_param in slot.places:
            if not is_param:
                owner._buffers[name] = empty
                continue
            # ``.data`` cannot change a Parameter's device: swap the whole tensor, so that the object (which the
            # caller may hold) stays; one with weak references to it cannot be swapped and is replaced.
            param = owner._parameters[name]
            assert param is not None  # tensor_slots found a Parameter in this slot
            replacement = torch.nn.Parameter(empty, requires_grad=param.requires_grad)
            try:
                torch.utils.swap_tensors(param, replacement)
            except RuntimeError:
                owner._parameters[name] = replacement
        slot.tensor = empty


def read_back(slots: Sequence[TensorSlot], copy: DiskCopy, pin: bool) -> int:
    """Point every slot at its tensor read from disk (pinned when ``pin``). Returns the bytes read."""
    by_path: dict[str, list[TensorSlot]] = {}
    for slot in slots:
        by_path.setdefault(copy.sources[slot.key][0], []).append(slot)
    read = 0
    for path, group in by_path.items():
        with safe_open(path, framework="pt", device="cpu") as handle:
            for slot in group:
                _assign(slot, _laid_out(handle.get_tensor(copy.sources[slot.key][1]), slot.stride, pin))
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
