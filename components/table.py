"""The text table ``print(ComponentsManager)`` shows: models, other components, additional info.

This module reads a manager into rows and cells; ``components.table_layout`` lays them out (widths, the
terminal's width, one size unit per column, the one-line-per-component summary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from offload.devices.units import GiB, format_bytes
from offload.records.residency import Residency

from .table_layout import (
    EMPTY_TABLE,
    MODEL_HEADER,
    MODIFIED_MARK,
    OTHER_HEADER,
    ModelRow,
    OtherRow,
    fit_table,
    render_summary,
    render_table,
)

if TYPE_CHECKING:
    from .manager import ComponentsManager

__all__ = [
    "DISK",
    "EMPTY_TABLE",
    "HOST",
    "MODEL_HEADER",
    "MODIFIED_MARK",
    "OTHER_HEADER",
    "device_cell",
    "lora_cell",
    "check_width",
    "manager_rows",
    "manager_summary",
    "manager_table",
    "manager_text",
    "quantization_cell",
]

#: Where a model placed by auto offload is while it is not on the device: its host copy.
HOST = "cpu"
#: Where it is while its host copy is dropped under a host budget: the files it is read back from.
DISK = "disk"


def device_cell(residency: Residency) -> str:
    """The device cell of a model auto offload places: ``"where now(where it runs)"``.

    ``"sim(sim)"`` or ``"cuda:0(cuda:0)"`` while it is on the device, ``"cpu(sim)"`` or ``"cpu(cuda:0)"``
    while it is on its host copy, ``"disk(sim)"`` while its host copy is dropped under a host budget,
    ``"partial 62%(sim)"`` while 62 % of its bytes are on the device and the rest streams per call;
    ``"cuda:0(pinned)"`` or ``"sim(pinned)"`` for a pinned model, which stays where it is (``offload.weights.pinned``).
    """
    if residency.pinned is not None:
        return f"{residency.pinned}(pinned)"
    where = residency.device if residency.resident else DISK if residency.on_disk else HOST
    if residency.resident and residency.resident_share is not None:
        share = residency.resident_share
        # A prefix of a few bytes (a victim shrunk to its base group) is on the device all the same: not "0%".
        where = "partial <1%" if 0 < share < 0.005 else f"partial {share:.0%}"
    return f"{where}({residency.device})"


def _plain_device_cell(info: dict[str, Any]) -> str:
    """The device cell of a model auto offload does not place: its devices, and any hook's execution device."""
    device = info["device"] or "N/A"
    return f"{device}({info['execution_device']})" if info["execution_device"] is not None else device


def quantization_cell(quantization: dict[str, Any] | None, size_gb: float) -> str | None:
    """The "Quantization" line of a quantized model: backend, weights, modules skipped, packed size.

    ``"torchao (Int8WeightOnlyConfig), skips ['conv_in'], packed 3.86 MiB"``; ``None`` for a model not quantized.
    """
    if not quantization:
        return None
    text = quantization["method"] or "unknown method"
    if quantization["weights"]:
        text += f" ({quantization['weights']})"
    if quantization["skipped_modules"]:
        text += f", skips {quantization['skipped_modules']}"
    return f"{text}, packed {format_bytes(size_gb * GiB)}"


def lora_cell(adapters: list[dict[str, Any]] | None) -> str | None:
    """The "LoRA" line of a model holding LoRA adapters (``components.model_info.lora_info``), ``None`` without.

    ``"style (active, weight 0.8, fused, loaded by StableDiffusionAutoBlocks@0x7f...); ink (inactive, ...)"``.
    """
    if not adapters:
        return None
    parts = []
    for adapter in adapters:
        facts = [
            "active" if adapter["active"] else "inactive",
            f"weight {adapter['weight']}",
            "fused" if adapter["fused"] else "not fused",
        ]
        if adapter["loaded_by"]:
            facts.append(f"loaded by {adapter['loaded_by']}")
        parts.append(f"{adapter['name']} ({', '.join(facts)})")
    return "; ".join(parts)


def ip_adapter_cell(ip_adapter: dict[str, Any] | None) -> str | None:
    """The "IP-Adapter" line of a model holding one (``components.model_info.ip_adapter_info``), ``None`` without.

    ``"image encoder image_encoder_1407...; scale 0.5 (down_blocks.1, up_blocks.0), 0.0 (mid_block); loaded by
    StableDiffusionAutoBlocks@0x7f..."``.
    """
    if not ip_adapter:
        return None
    by_scale: dict[str, list[str]] = {}
    for block, scale in ip_adapter["scale_per_block"].items():
        by_scale.setdefault(str(scale), []).append(block)
    scales = ", ".join(f"{scale} ({', '.join(blocks)})" for scale, blocks in by_scale.items())
    encoder = ip_adapter["image_encoder"] or "none"
    loaded_by = ip_adapter.get("loaded_by")
    return f"image encoder {encoder}; scale {scales}" + (f"; loaded by {loaded_by}" if loaded_by else "")


Extras = list[tuple[str, dict[str, Any]]]


def manager_rows(
    manager: ComponentsManager, residency: Callable[[str], Residency | None]
) -> tuple[list[ModelRow], list[OtherRow], Extras]:
    """The rows of a ``ComponentsManager``'s table, built from its public look-ups.

    Args:
        manager: The manager to show.
        residency: What auto offload reports about a component id, or ``None`` (offload off).

    Returns:
        ``(models, others, extras)``: one row per model and per other component, and each model's facts for
        "Additional Component Info".
    """
    models, others, extras = [], [], []
    for component_id, component in manager.components.items():
        info = manager.get_model_info(component_id)
        collections = tuple(info["collection"].split(", ")) if info["collection"] else ()
        if not isinstance(component, torch.nn.Module):
            others.append(OtherRow(component_id, info["class_name"], collections))
            continue
        placed = residency(component_id)
        models.append(
            ModelRow(
                component_id=component_id,
                class_name=info["class_name"],
                device=device_cell(placed) if placed is not None else _plain_device_cell(info),
                dtype=info["dtype"] or "N/A",
                size=info["size_gb"] * GiB,
                load_id=info["load_id"] or "N/A",
                collections=collections,
                modified=bool(info["modified"]),
            )
        )
        extra = {
            "Adapters": info["adapters"],
            "LoRA": lora_cell(info["lora"]),
            "IP-Adapter": ip_adapter_cell(info["ip_adapter"]),
            "Quantization": quantization_cell(info["quantization"], info["size_gb"]),
            "Modified": "; ".join(info["modified"]) if info["modified"] else None,
        }
        extras.append((component_id, extra))
    return models, others, extras


def check_width(width: object, method: str) -> None:
    """Refuse a ``width`` that is not a whole number of columns of at least 1 (or ``None``)."""
    if width is None:
        return
    if isinstance(width, bool) or not isinstance(width, int):
        msg = f"{method}(width=...) must be a number of columns or None (got {width!r} that is a {type(width)})."
        raise TypeError(msg)
    if width < 1:
        msg = f"{method}(width=...) must be at least 1 column, or None for the full table (got {width})."
        raise ValueError(msg)


def manager_table(
    manager: ComponentsManager, residency: Callable[[str], Residency | None], width: int | None = None
) -> str:
    """The manager's table: in full with ``width=None``, else shrunk towards ``width`` columns (``fit_table``).

    A table that cannot be made as narrow as ``width`` comes back in its narrowest form, wider than asked.
    """
    rows = manager_rows(manager, residency)
    return render_table(*rows) if width is None else fit_table(*rows, width)[0]


def manager_summary(
    manager: ComponentsManager, residency: Callable[[str], Residency | None], width: int | None = None
) -> str:
    """The manager's components one line each (``render_summary``), load IDs shortened to fit ``width``."""
    return render_summary(*manager_rows(manager, residency), width)


def manager_text(manager: ComponentsManager, residency: Callable[[str], Residency | None], width: int) -> str:
    """What ``print(cm)`` shows in ``width`` columns: the table if it can be made to fit, else the summary."""
    rows = manager_rows(manager, residency)
    text, fits = fit_table(*rows, width)
    return text if fits else render_summary(*rows, width)
