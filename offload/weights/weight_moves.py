"""Moving a model's tensors between the host and the device, keeping the host copy of each.

Every weight has a host tensor (pinned on CUDA, so uploads are asynchronous). Uploading a model keeps
that host tensor aside (``HostCopies``); taking the model off the device points each slot back at it,
so zero bytes move device-to-host. The one exception is a tensor found on the device with no host copy:
it was replaced there behind our back, and is copied to the host so its value is kept (those bytes are
returned and counted).

A tensor moves by setting ``param.data``, which keeps the Parameter object, and every reference to it,
valid. Where ``.data`` cannot take the device tensor (the meta device, or a wrapper tensor subclass such
as torchao's quantized tensors, see ``is_traceable_wrapper_subclass``) the slot gets a new Parameter and
the original is kept as the host copy. A tensor shared by several slots (tied weights) gets one device
copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["HostCopies", "WeightMoves"]


@attrs.define
class HostCopies:
    """The host side of a model on the device: what ``WeightMoves.upload`` set aside for the way back."""

    # Host tensors of uploaded slots, keyed by id(parameter) or (id(owner module), buffer name).
    host: dict[object, torch.Tensor] = attrs.field(factory=dict)
    # Slots given a new device Parameter where the tensor type cannot change in place, keyed by (id(owner), name)
    # so that dropping a group finds its own slots without reading every other one: (owner, original).
    swapped: dict[tuple[int, str], tuple[torch.nn.Module, torch.nn.Parameter]] = attrs.field(factory=dict)

    def substitutes(self) -> dict[int, int]:
        """``id`` of each Parameter put in a slot by ``upload``, mapped to the ``id`` of the original it
        stands for (so a fingerprint reads the model as unchanged)."""
        substitute = {}
        for (_, name), (owner, original) in self.swapped.items():
            swapped_in = owner._parameters[name]
            if swapped_in is not None:
                substitute[id(swapped_in)] = id(original)
        return substitute


def _buffer_slots(module: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, str, torch.Tensor]]:
    for owner in module.modules():
        for name, buffer in owner._buffers.items():
            if buffer is not None:
                yield owner, name, buffer


@attrs.frozen
class WeightMoves:
    """Moves weights between the host and ``device``.

    Args:
        device: Where uploaded tensors go.
        pin: Pin host tensors and upload without blocking (CUDA).
    """

    device: torch.device
    pin: bool

    def host_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the host, pinned when ``pin`` is set (no copy if it is there already)."""
        host = tensor if tensor.device.type == "cpu" else tensor.to("cpu")
        if self.pin and not host.is_pinned():
            host = host.pin_memory()
        return host

    def to_host(self, module: torch.nn.Module) -> int:
        """Point every weight of ``module`` at a host tensor. Returns bytes copied off a device."""
        copied = 0
        replaced: dict[int, torch.nn.Parameter] = {}
        for owner in module.modules():
            for name, param in owner._parameters.items():
                if param is None:
                    continue
                if param.device.type != "cpu" and id(param) not in replaced:
                    copied += param.nbytes
                if is_traceable_wrapper_subclass(param):  # no .data setter (quantized tensors): a new slot
                    if id(param) not in replaced:
                        host = self.host_tensor(param)
                        # Already a host tensor as wanted: the Parameter stays, so references to it stay live.
                        replaced[id(param)] = (
                            param
                            if host is param
                            else torch.nn.Parameter(host, requires_grad=param.requires_grad)
                        )
                    owner._parameters[name] = replaced[id(param)]
                else:
                    param.data = self.host_tensor(param.data)
        for owner, name, buffer in _buffer_slots(module):
            if buffer.device.type != "cpu":
                copied += buffer.nbytes
            owner._buffers[name] = self.host_tensor(buffer)
        return copied

    def upload(
        self,
        module: torch.nn.Module,
        copies: HostCopies,
        owners: Sequence[torch.nn.Module] | None = None,
    ) -> None:
        """Put the own tensors of ``owners`` (default: every submodule of ``module``) on the device, setting
        their host tensors aside in ``copies``. Tensors already on the device stay."""
        device = self.device
        # One device copy per host tensor, even if shared (tied weights): parameters and buffers apart,
        # since a parameter slot takes a Parameter.
        done: dict[int, torch.nn.Parameter] = {}
        done_buffers: dict[int, torch.Tensor] = {}
        for owner in module.modules() if owners is None else owners:
            for name, param in owner._parameters.items():
                if param is None or param.device == device:
                    continue
                if id(param) in done:  # a tied parameter already swapped in another slot
                    owner._parameters[name] = done[id(param)]
                    copies.swapped[id(owner), name] = (owner, param)
                    continue
                wrapper = is_traceable_wrapper_subclass(param)  # e.g. torchao's quantized tensors
                on_device = (param if wrapper else param.data).to(device, non_blocking=self.pin)
                if not wrapper and torch._has_compatible_shallow_copy_type(param.data, on_device):
                    # Keep the Parameter object (references to it stay valid); remember its host tensor.
                    copies.host[id(param)] = param.data
                    param.data = on_device
                    done[id(param)] = param
                else:  # the meta device, or a tensor subclass whose .data cannot be set (torchao's quantized
                    # tensors; diffusers' group offloading swaps those with torch.utils.swap_tensors instead):
                    # a new Parameter in the slot, the original kept as the host copy
                    swapped = torch.nn.Parameter(on_device, requires_grad=param.requires_grad)
                    owner._parameters[name] = swapped
                    copies.swapped[id(owner), name] = (owner, param)
                    done[id(param)] = swapped
            for name, buffer in owner._buffers.items():
                if buffer is None or buffer.device == device:
                    continue
                copies.host[(id(owner), name)] = buffer
                if id(buffer) not in done_buffers:
                    done_buffers[id(buffer)] = buffer.to(device, non_blocking=self.pin)
                owner._buffers[name] = done_buffers[id(buffer)]

    def drop(self, module: torch.nn.Module, copies: HostCopies) -> int:
        """Point every tensor of ``module`` back at its host copy and empty ``copies``. Returns device-to-host
        bytes (see ``drop_owners``)."""
        copied = self.drop_owners(copies, list(module.modules()))
        copies.host.clear()
        copies.swapped.clear()
        return copied

    def drop_owners(self, copies: HostCopies, owners: Sequence[torch.nn.Module]) -> int:
        """Point ``owners``' own tensors back at their host copies in ``copies``.

        A tensor found on the device without a host copy (replaced there behind our back) is copied to the
        host, so its value is kept; the bytes copied are returned."""
        for owner in owners:
            for name in list(owner._parameters):
                slot = copies.swapped.pop((id(owner), name), None)
                if slot is not None:
                    owner._parameters[name] = slot[1]
        copied = 0
        for owner in owners:
            for name, param in owner._parameters.items():
                host = None if param is None else copies.host.pop(id(param), None)
                if param is None or (host is None and param.device.type in ("cpu", "meta")):
                    continue
                if host is None:  # replaced on the device behind our back: keep its value
                    copied += param.nbytes
                    if is_traceable_wrapper_subclass(param):  # no .data setter: a host Parameter in its slot
                        host = self.host_tensor(param)
                        owner._parameters[name] = torch.nn.Parameter(host, requires_grad=param.requires_grad)
                        continue
                    host = self.host_tensor(param.data)
                param.data = host
            for name, buffer in owner._buffers.items():
                host = None if buffer is None else copies.host.pop((id(owner), name), None)
                if buffer is None or (host is None and buffer.device.type in ("cpu", "meta")):
                    continue
                if host is None:
                    host = self.host_tensor(buffer)
                    copied += buffer.nbytes
                owner._buffers[name] = host
        return copied

    def sync_host(self, module: torch.nn.Module, copies: HostCopies) -> int:
        """Copy the device weights of ``module``, on the device, into fresh host tensors in ``copies`` (after
        an in-place change). Returns the bytes copied."""
        copied = 0
        swapped_in = set()
        for key, (owner, original) in copies.swapped.items():
            name = key[1]
            on_device = owner._parameters[name]
            assert on_device is not None  # upload put a Parameter in every slot it recorded as swapped
            swapped_in.add(id(on_device))
            if on_device.device.type != "meta":  # meta holds no values to copy
                host = self.host_tensor(
                    on_device if is_traceable_wrapper_subclass(on_device) else on_device.data
                )
                if is_traceable_wrapper_subclass(original):
                    original = torch.nn.Parameter(host, requires_grad=original.requires_grad)
                else:
                    original.data = host
                copied += on_device.nbytes
            copies.swapped[key] = (owner, original)
        copies.host = {k: v for k, v in copies.host.items() if isinstance(k, tuple)}
        for param in module.parameters():
            if param.device.type != "cpu" and id(param) not in swapped_in:
                copies.host[id(param)] = self.host_tensor(param.data)
                copied += param.nbytes
        for owner, name, buffer in _buffer_slots(module):
            if buffer.device.type != "cpu":
                copies.host[(id(owner), name)] = self.host_tensor(buffer)
                copied += buffer.nbytes
        return copied
