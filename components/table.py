"""The text table ``print(ComponentsManager)`` shows: models, other components, additional info."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from offload.devices.units import format_bytes
from offload.records.residency import Residency

if TYPE_CHECKING:
    from .manager import ComponentsManager

__all__ = [
    "DISK",
    "EMPTY_TABLE",
    "HOST",
    "MODIFIED_MARK",
    "MODEL_HEADER",
    "OTHER_HEADER",
    "device_cell",
    "lora_cell",
    "manager_table",
    "quantization_cell",
    "render_table",
]

# Sizes print in a unit that suits them (format_bytes), so a small model does not read as 0.00 GB.
MODEL_HEADER = ("Name_ID", "Class", "Device: act(exec)", "Dtype", "Size", "Load ID", "Collection")
OTHER_HEADER = ("ID", "Class", "Collection")
EMPTY_TABLE = "Components: none registered."
#: Where a model placed by auto offload is while it is not on the device: its host copy.
HOST = "cpu"
#: Where it is while its host copy is dropped under a host budget: the files it is read back from.
DISK = "disk"


def _expand(rows: Sequence[tuple[Sequence[str], Sequence[str]]], width: int) -> list[list[str]]:
    """One line per collection: the first beside the row's cells, the others under it with blank cells."""
    lines = []
    for cells, collections in rows:
        names = list(collections) or ["N/A"]
        lines.append([*cells, names[0]])
        lines.extend([*([""] * (width - 1)), extra] for extra in names[1:])
    return lines


def _widths(header: Sequence[str], lines: list[list[str]]) -> list[int]:
    return [max(len(str(cell)) for cell in column) for column in zip(header, *lines)]


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return " | ".join(f"{cell:<{width}}" for cell, width in zip(cells, widths)).rstrip()


def render_table(
    models: Sequence[tuple[Sequence[str], Sequence[str]]],
    others: Sequence[tuple[Sequence[str], Sequence[str]]],
    extras: Sequence[tuple[str, dict[str, Any]]],
) -> str:
    """Renders the manager's table, every column as wide as its widest cell.

    Args:
        models: ``(cells, collections)`` per model; cells are Name_ID, Class, Device, Dtype, Size, Load ID.
        others: ``(cells, collections)`` per other component; cells are ID and Class.
        extras: ``(component id, {"Adapters": ..., "IP-Adapter": ..., "Quantization": ...})`` for the
            components that have any of these; empty values are left out.
    """
    if not models and not others:
        return EMPTY_TABLE
    model_lines = _expand(models, len(MODEL_HEADER))
    other_lines = _expand(others, len(OTHER_HEADER))
    model_widths = _widths(MODEL_HEADER, model_lines)
    other_widths = _widths(OTHER_HEADER, other_lines)
    # The id column lines up across both tables, as in the seed.
    id_width = max(model_widths[0] if models else 0, other_widths[0] if others else 0)
    model_widths[0] = other_widths[0] = id_width
    total = max(
        sum(model_widths) + 3 * (len(model_widths) - 1) if models else 0,
        sum(other_widths) + 3 * (len(other_widths) - 1) if others else 0,
    )
    dash, rule = "-" * total, "=" * total
    out = ["Components:", rule]
    if models:
        out += ["Models:", dash, _line(MODEL_HEADER, model_widths), dash]
        out += [_line(line, model_widths) for line in model_lines]
        out.append(dash)
    if others:
        if models:
            out.append("")
        out += ["Other Components:", dash, _line(OTHER_HEADER, other_widths), dash]
        out += [_line(line, other_widths) for line in other_lines]
        out.append(dash)
    shown = [(component_id, {k: v for k, v in info.items() if v}) for component_id, info in extras]
    shown = [(component_id, info) for component_id, info in shown if info]
    if shown:
        out += ["", "Additional Component Info:", rule]
        for component_id, info in shown:
            out.append(f"{component_id}:")
            out += [f"  {key}: {value}" for key, value in info.items()]
    return "\n".join(out)


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

    ``"torchao (Int8WeightOnlyConfig), skips ['conv_in'], packed 3.86 MB"``; ``None`` for a model not quantized.
    """
    if not quantization:
        return None
    text = quantization["method"] or "unknown method"
    if quantization["weights"]:
        text += f" ({quantization['weights']})"
    if quantization["skipped_modules"]:
        text += f", skips {quantization['skipped_modules']}"
    return f"{text}, packed {format_bytes(size_gb * 1024**3)}"


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


#: Follows the load ID of a model whose weights differ from it (the "Modified" line says how).
MODIFIED_MARK = " (modified)"


def _load_id_cell(info: dict[str, Any]) -> str:
    """The load ID, marked when the weights are no longer its (``components.weight_marks``)."""
    load_id = info["load_id"] or "N/A"
    return load_id + MODIFIED_MARK if info["modified"] else load_id


def manager_table(manager: ComponentsManager, residency: Callable[[str], Residency | None]) -> str:
    """The table of a ``ComponentsManager``, built from its public look-ups.

    Args:
        manager: The manager to show.
        residency: What auto offload reports about a component id, or ``None`` (offload off).
    """
    models, others, extras = [], [], []
    for component_id, component in manager.components.items():
        info = manager.get_model_info(component_id)
        collections = info["collection"].split(", ") if info["collection"] else []
        if not isinstance(component, torch.nn.Module):
            others.append(((component_id, info["class_name"]), collections))
            continue
        placed = residency(component_id)
        cells = (
            component_id,
            info["class_name"],
            device_cell(placed) if placed is not None else _plain_device_cell(info),
            info["dtype"] or "N/A",
            format_bytes(info["size_gb"] * 1024**3),
            _load_id_cell(info),
        )
        models.append((cells, collections))
        extra = {
            "Adapters": info["adapters"],
            "LoRA": lora_cell(info["lora"]),
            "IP-Adapter": ip_adapter_cell(info["ip_adapter"]),
            "Quantization": quantization_cell(info["quantization"], info["size_gb"]),
            "Modified": "; ".join(info["modified"]) if info["modified"] else None,
        }
        extras.append((component_id, extra))
    return render_table(models, others, extras)
