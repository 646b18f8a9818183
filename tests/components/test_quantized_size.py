"""Sizes of quantized weights: counted from their packed storage, not their logical shape."""

import torch

from components import ComponentsManager
from offload import module_nbytes


class Packed(torch.Tensor):
    """A stand-in for a quantized weight (torchao/quanto style): logical float32, stored as packed uint8."""

    @staticmethod
    def __new__(cls, packed, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device=packed.device)

    def __init__(self, packed, shape):
        self.packed = packed

    def __tensor_flatten__(self):
        return ["packed"], {"shape": self.shape}

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Packed(inner["packed"], meta["shape"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            return Packed(args[0].packed, args[0].shape)
        raise NotImplementedError(str(func))


def quantized_linear() -> torch.nn.Module:
    module = torch.nn.Module()
    packed = torch.zeros(128, 64, dtype=torch.uint8)  # 8 KiB holding a logical [256, 64] float32 (64 KiB)
    module.weight = torch.nn.Parameter(Packed(packed, (256, 64)), requires_grad=False)
    return module


def test_a_quantized_weight_counts_its_packed_bytes():
    """A wrapper-subclass weight is sized by its inner storage: 8 KiB, not the 64 KiB of its shape."""
    assert module_nbytes(quantized_linear()) == 128 * 64


def test_the_manager_reports_the_packed_size():
    """get_model_info's size_gb of a quantized model is its packed size."""
    cm = ComponentsManager()
    component_id = cm.add("transformer", quantized_linear())
    assert cm.get_model_info(component_id, "size_gb") == {"size_gb": 128 * 64 / 1024**3}


def test_meta_weights_hold_no_memory_in_the_table_but_count_for_simulation():
    """Meta tensors are 0 bytes for the manager and their full size for the simulated offload benchmarks."""
    module = torch.nn.Linear(256, 256, bias=False, device="meta")
    cm = ComponentsManager()
    component_id = cm.add("model", module)
    assert cm.get_model_info(component_id, "size_gb") == {"size_gb": 0.0}
    assert module_nbytes(module) == 256 * 256 * 4
