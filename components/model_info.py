"""Facts about one registered object: size from real storage, device, dtype, adapters, quantization."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from offload.residency import Residency
from offload.storage import module_nbytes

from .load_id import get_load_id

__all__ = [
    "INFO_FIELDS",
    "component_info",
    "adapter_names",
    "ip_adapter_info",
    "module_devices",
    "module_dtype",
    "quantization_info",
    "storage_bytes",
]


#: The fields ``ComponentsManager.get_model_info`` returns.
INFO_FIELDS = (
    "model_id",
    "added_time",
    "collection",
    "class_name",
    "size_gb",
    "device",
    "dtype",
    "load_id",
    "adapters",
    "has_hook",
    "execution_device",
    "ip_adapter",
    "quantization",
)


def _tensors(module: torch.nn.Module):
    return itertools.chain(module.parameters(), module.buffers())


def storage_bytes(module: torch.nn.Module) -> int:
    """Bytes held by the module's weights: each storage once, quantized weights by their packed
    storage, meta tensors (which hold no memory) not at all."""
    return module_nbytes(module, count_meta=False)


def module_devices(module: torch.nn.Module) -> list[str]:
    """The distinct devices the module's tensors are on, sorted (empty for a module without tensors)."""
    return sorted({str(tensor.device) for tensor in _tensors(module)})


def module_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the first floating-point parameter (else of the first tensor), or ``None``."""
    first = None
    for tensor in _tensors(module):
        if tensor.is_floating_point():
            return tensor.dtype
        first = first or tensor.dtype
    return first


def adapter_names(module: torch.nn.Module) -> list[str] | None:
    """Names of the peft (LoRA) adapters loaded into the module, or ``None`` when it has none."""
    config = getattr(module, "peft_config", None)
    if isinstance(config, dict) and config:
        return list(config)
    return None


def ip_adapter_info(module: torch.nn.Module) -> dict[str, Any] | None:
    """IP-Adapter state of an attention model: how many processors carry image projections, and their scales.

    Recognised structurally: a processor with ``to_k_ip`` layers (diffusers' IP-Adapter processors).
    """
    processors = getattr(module, "attn_processors", None)
    if not isinstance(processors, dict):
        return None
    ip = [proc for proc in processors.values() if hasattr(proc, "to_k_ip")]
    if not ip:
        return None
    scales: list[Any] = []
    for proc in ip:
        scale = getattr(proc, "scale", None)
        for value in scale if isinstance(scale, (list, tuple)) else [scale]:
            if value not in scales:
                scales.append(value)
    return {"processors": len(ip), "scales": scales}


def quantization_info(module: Any) -> dict[str, Any] | None:
    """The quantization config of a model quantized at load time (diffusers or transformers), or ``None``."""
    quantizer = getattr(module, "hf_quantizer", None)
    config = getattr(quantizer, "quantization_config", None)
    if config is None:
        return None
    if hasattr(config, "to_diff_dict"):
        return config.to_diff_dict()
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def component_info(
    component_id: str,
    component: Any,
    added_time: float,
    collections: list[str],
    residency: Residency | None,
) -> dict[str, Any]:
    """Every field of ``INFO_FIELDS`` for one registered object; model-only fields are ``None`` for others.

    ``residency`` is what the offload engine reports about the object, or ``None`` when auto offload is off
    (then ``has_hook`` and ``execution_device`` are read from any accelerate hook the module carries).
    """
    info: dict[str, Any] = dict.fromkeys(INFO_FIELDS)
    info.update(
        model_id=component_id,
        added_time=added_time,
        collection=", ".join(collections) or None,
        class_name=type(component).__name__,
        load_id=get_load_id(component),
    )
    if isinstance(component, torch.nn.Module):
        dtype = module_dtype(component)
        hook = getattr(component, "_hf_hook", None)
        info.update(
            size_gb=storage_bytes(component) / 1024**3,
            device=",".join(module_devices(component)) or None,
            dtype=None if dtype is None else str(dtype),
            adapters=adapter_names(component),
            has_hook=residency.attached if residency is not None else hook is not None,
            execution_device=residency.execution_device
            if residency is not None
            else getattr(hook, "execution_device", None),
            ip_adapter=ip_adapter_info(component),
            quantization=quantization_info(component),
        )
    return info
