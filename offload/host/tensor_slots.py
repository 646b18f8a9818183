"""A model's tensors as slots, and pointing those slots elsewhere: at placeholders, meta tensors or new values.

A slot is one tensor and every place that holds it (tied weights are one slot). A wrapper tensor subclass (a
quantized weight: torchao's ``Int8Tensor``) counts by its inner plain tensors, each pointed elsewhere through
its wrapper's attribute, so the wrapper object, its type and its context stay in place. Dropping a host copy
(``drop_tensors``), emptying a model that leaves (``empty_tensors``) and reading one back
(``offload.host.disk_copies.read_back``) all go through ``assign``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch.utils._python_dispatch import TraceableWrapperSubclass, is_traceable_wrapper_subclass

__all__ = ["TensorSlot", "assign", "drop_tensors", "empty_tensors", "tensor_slots"]


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
                    view += (holder is None,)  # never one slot for an inner and a plain tensor (assign)
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


def _placeholder(tensor: torch.Tensor) -> torch.Tensor:
    # One element broadcast to the shape: the slot keeps its shape, dtype and device for the fingerprint and
    # for readers of the module, and holds no memory. NaN where the dtype has it, so a forward that bypasses
    # the hook gives NaN rather than plausible numbers.
    fill = float("nan") if tensor.is_floating_point() or tensor.is_complex() else 0
    return torch.full((), fill, dtype=tensor.dtype, device=tensor.device).expand(tensor.shape)


def assign(slot: TensorSlot, tensor: torch.Tensor) -> None:
    """Point every place holding ``slot`` at ``tensor``."""
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
        assign(slot, _placeholder(slot.tensor))


def empty_tensors(slots: Sequence[TensorSlot]) -> None:
    """Point every slot at a meta tensor of its shape, stride and dtype: a model that leaves without its
    weights holds no placeholder that computes NaN; any use of it fails loudly (``Tensor on device meta``)."""
    for slot in slots:
        tensor = slot.tensor
        empty = torch.empty_strided(tensor.shape, slot.stride, dtype=tensor.dtype, device="meta")
        if slot.holders:
            assign(slot, empty)
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
