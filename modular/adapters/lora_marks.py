"""The modified mark (``components.weight_marks``) of models a LoRA is fused into, and its end at unfusing.

Fusing writes the LoRA into the model's weights, which then are no longer its load ID's: the model is marked,
and keeps the mark after ``unload_lora_weights`` (the fused values stay). Unfusing subtracts in floating point,
so the mark goes only when every unfused layer equals the source files again; otherwise it says so.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from components.model_info import lora_info, lora_layers
from components.weight_marks import FUSED_LORA, clear_modified, mark_modified, matches_source
from modular.adapters.lora_saving import plain_state_dict

__all__ = ["mark_fused", "mark_unfused"]


def mark_fused(models: Iterable[torch.nn.Module | None], lora_scale: float, by: str) -> None:
    """Marks each model holding a fused adapter: which adapters, at which scale, fused by which pipeline."""
    for model in models:
        fused = [adapter["name"] for adapter in lora_info(model) or [] if adapter["fused"]] if model else []
        if fused:
            description = f"LoRA {fused} fused (lora_scale {lora_scale}) by {by}"
            mark_modified(model, FUSED_LORA, description)


def mark_unfused(models: Iterable[torch.nn.Module | None]) -> None:
    """After unfusing: a model with nothing fused any more loses the mark if its weights equal the source's."""
    for model in models:
        if model is None or any(layer.merged_adapters for layer in lora_layers(model)):
            continue  # still fused (or never was): the mark stays as it is
        layers = {id(layer) for layer in lora_layers(model)}  # once: the walk is over every module
        wrapped = {name for name, module in model.named_modules() if id(module) in layers}
        touched = {
            key: tensor
            for key, tensor in plain_state_dict(model).items()
            if key.rpartition(".")[0] in wrapped
        }
        same = matches_source(model, touched)
        if same:
            clear_modified(model, FUSED_LORA)
            continue
        why = "they differ from the source's" if same is False else "no source file to compare them with"
        mark_modified(
            model, FUSED_LORA, f"LoRA fused, then unfused: the weights may not be the source's ({why})"
        )
