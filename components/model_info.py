"""Facts about one registered object: size from real storage, device, dtype, adapters, quantization."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from offload.devices.storage import module_nbytes
from offload.records.residency import Residency

from .load_id import get_load_id
from .quantization import describe_quantization, quantization_method
from .weight_marks import modifications

__all__ = [
    "INFO_FIELDS",
    "component_info",
    "adapter_names",
    "forget_lora_sources",
    "lora_info",
    "lora_layers",
    "record_lora_source",
    "ip_adapter_info",
    "is_bitsandbytes",
    "module_devices",
    "module_dtype",
    "quantization_config",
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
    "lora",
    "has_hook",
    "execution_device",
    "ip_adapter",
    "quantization",
    "resident_share",
    "pinned",
    "modified",
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


#: The attribute of a model that records which pipeline loaded each of its LoRA adapters. It lives on the model,
#: as the adapters do, so every manager and pipeline sharing the model reads the same record.
LORA_SOURCES = "_lora_loaded_by"


def lora_layers(module: torch.nn.Module) -> list[Any]:
    """The peft LoRA layers inside the module (empty when it holds none)."""
    from peft.tuners.lora import LoraLayer

    return [layer for layer in module.modules() if isinstance(layer, LoraLayer)]


def record_lora_source(module: torch.nn.Module, adapter_name: str, loaded_by: str) -> None:
    """Records that ``loaded_by`` (a pipeline's label) loaded the LoRA adapter ``adapter_name`` into ``module``."""
    sources = dict(getattr(module, LORA_SOURCES, None) or {})
    sources[adapter_name] = loaded_by
    setattr(module, LORA_SOURCES, sources)


def forget_lora_sources(module: torch.nn.Module | None, adapter_names: list[str] | None) -> None:
    """Drops the record of these adapters (all when ``None``) once they are deleted or unloaded."""
    sources = getattr(module, LORA_SOURCES, None) if module is not None else None
    if sources:
        kept = {} if adapter_names is None else {k: v for k, v in sources.items() if k not in adapter_names}
        setattr(module, LORA_SOURCES, kept)


def _lora_weight(layer: Any, name: str) -> float:
    """The weight ``set_adapters`` gave an adapter in one layer: its scaling over the scaling at weight 1."""
    rank = layer.r[name] ** 0.5 if layer.use_rslora.get(name, False) else layer.r[name]
    return round(layer.scaling[name] * rank / layer.lora_alpha[name], 6)


def lora_info(module: torch.nn.Module) -> list[dict[str, Any]] | None:
    """Each LoRA adapter of the module, or ``None`` when it holds none.

    ``{"name", "active", "weight", "fused", "loaded_by"}`` per adapter: ``weight`` is one number, or the sorted
    distinct weights when blocks differ; ``loaded_by`` is the pipeline that loaded it (``None`` when it was
    added by other means).
    """
    layers = lora_layers(module)
    names = list(dict.fromkeys(name for layer in layers for name in layer.scaling))
    if not names:  # no LoRA layers, or layers whose adapters were all deleted
        return None
    sources = getattr(module, LORA_SOURCES, None) or {}
    adapters = []
    for name in names:
        holding = [layer for layer in layers if name in layer.scaling]
        weights = sorted({_lora_weight(layer, name) for layer in holding})
        adapters.append(
            {
                "name": name,
                "active": any(
                    name in layer.active_adapters and not layer.disable_adapters for layer in holding
                ),
                "weight": weights[0] if len(weights) == 1 else weights,
                "fused": any(name in layer.merged_adapters for layer in holding),
                "loaded_by": sources.get(name),
            }
        )
    return adapters


#: The attribute of a model that records the load ID of the image encoder its IP-Adapter was loaded with.
IP_ADAPTER_ENCODER = "_ip_adapter_image_encoder"
#: The attribute of a model that records which pipeline loaded its IP-Adapter (a pipeline's label), so that a
#: pipeline sharing the model can say where the adapter it finds came from.
IP_ADAPTER_SOURCE = "_ip_adapter_loaded_by"


def _block_of(processor_name: str) -> str:
    """The block a processor belongs to: ``"down_blocks.1"``, ``"mid_block"``, ``"single_transformer_blocks.3"``."""
    parts = processor_name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def ip_adapter_info(module: torch.nn.Module) -> dict[str, Any] | None:
    """IP-Adapter state of an attention model, or ``None`` when it holds none.

    ``{"processors": n, "scales": [...], "scale_per_block": {block: scale}, "image_encoder": load ID,
    "loaded_by": pipeline label}``:
    ``scales`` are the distinct scales; a block's scale is one number, or a list where its layers or loaded
    adapters differ. Recognised structurally: a processor with ``to_k_ip`` layers (diffusers' IP-Adapter
    processors).
    """
    processors = getattr(module, "attn_processors", None)
    if not isinstance(processors, dict):
        return None
    ip = {name: proc for name, proc in processors.items() if hasattr(proc, "to_k_ip")}
    if not ip:
        return None
    scales: list[Any] = []
    per_block: dict[str, list[Any]] = {}
    for name, proc in ip.items():
        scale = getattr(proc, "scale", None)
        block = per_block.setdefault(_block_of(name), [])
        for value in scale if isinstance(scale, (list, tuple)) else [scale]:
            if value not in scales:
                scales.append(value)
            if value not in block:
                block.append(value)
    return {
        "processors": len(ip),
        "scales": scales,
        "scale_per_block": {
            block: values[0] if len(values) == 1 else values for block, values in per_block.items()
        },
        "image_encoder": getattr(module, IP_ADAPTER_ENCODER, None),
        "loaded_by": getattr(module, IP_ADAPTER_SOURCE, None),
    }


def quantization_config(module: Any) -> Any:
    """The config a model was quantized with at load time (diffusers or transformers), or ``None``."""
    return getattr(getattr(module, "hf_quantizer", None), "quantization_config", None)


#: bitsandbytes' parameter classes, recognised by name so that bitsandbytes need not be installed.
BITSANDBYTES_PARAMETERS = {"Params4bit", "Int8Params"}


def is_bitsandbytes(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds bitsandbytes-quantized weights (loaded with such a config, or holding its
    parameter classes): their packed state lives beside the tensors, so offload cannot move them."""
    if quantization_method(quantization_config(module)) == "bitsandbytes":
        return True
    return any(
        type(param).__name__ in BITSANDBYTES_PARAMETERS and type(param).__module__.startswith("bitsandbytes")
        for param in module.parameters()
    )


def quantization_info(module: Any) -> dict[str, Any] | None:
    """What a model quantized at load time is quantized with, or ``None``.

    ``{"method": ..., "weights": ..., "skipped_modules": ...}`` (``components.quantization.describe_quantization``).
    """
    config = quantization_config(module)
    return None if config is None else describe_quantization(module, config)


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
        on_disk = (
            residency is not None and residency.on_disk
        )  # its slots hold placeholders (offload.host.host_tier)
        info.update(
            size_gb=(residency.disk_nbytes if residency and on_disk else storage_bytes(component)) / 1024**3,
            device="disk" if on_disk else ",".join(module_devices(component)) or None,
            dtype=None if dtype is None else str(dtype),
            adapters=adapter_names(component),
            lora=lora_info(component),
            has_hook=residency.attached if residency is not None else hook is not None,
            execution_device=residency.execution_device
            if residency is not None
            else getattr(hook, "execution_device", None),
            ip_adapter=ip_adapter_info(component),
            quantization=quantization_info(component),
            # Partly resident under auto offload (its tail streamed per call): the share on the device.
            resident_share=None if residency is None else residency.resident_share,
            # Pinned under auto offload (offload.weights.pinned): where it stays, e.g. "sim" or "cuda:0".
            pinned=None if residency is None else residency.pinned,
            # How its weights differ from its load ID's (components.weight_marks), or None: they do not.
            modified=modifications(component),
        )
    return info
