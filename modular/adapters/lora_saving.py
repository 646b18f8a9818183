"""Saving a model that holds LoRA layers: its plain weights, under the names its class loads.

peft wraps every layer a LoRA targets: ``to_q.weight`` becomes ``to_q.base_layer.weight`` beside
``to_q.lora_A.<adapter>.weight``. A model's own ``save_pretrained`` writes those names (diffusers), or only the
adapter (transformers), and the folder does not load back as the model. Here the save sees the model's plain
state dict instead: each wrapped layer's base weights under the layer's own name, the LoRA's own tensors left
out. Fused weights live in the base layer, so a fused LoRA is saved merged; one only loaded is not saved (save it
with the family's ``save_lora_weights``; docs/adapters.md). The tensors are the model's own (no copy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from components.model_info import lora_layers

__all__ = ["plain_state_dict", "saving_plain_weights"]


def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict without its LoRA layers: ``x.base_layer.y`` as ``x.y``, LoRA tensors left out."""
    wrapped = [name for name, module in model.named_modules() if module in set(lora_layers(model))]
    prefixes = sorted((f"{name}." for name in wrapped), key=len, reverse=True)
    plain: dict[str, torch.Tensor] = {}
    for key, tensor in type(model).state_dict(model).items():
        prefix = next((p for p in prefixes if key.startswith(p)), None)
        if prefix is None:
            plain[key] = tensor
        elif key.startswith(f"{prefix}base_layer."):
            plain[prefix + key.removeprefix(f"{prefix}base_layer.")] = tensor
        # Anything else under a wrapped layer is the LoRA's (lora_A, lora_B, magnitudes, embeddings).
    return plain


@contextlib.contextmanager
def saving_plain_weights(component: Any) -> Iterator[None]:
    """While inside, ``component.save_pretrained`` writes its plain weights (``plain_state_dict``); a no-op for a
    component without LoRA layers.

    Both libraries' ``save_pretrained`` read ``self.state_dict()`` and transformers' saves only the adapter
    while ``_hf_peft_config_loaded`` is set: both are shadowed on the instance for the save, then put back.
    """
    if not isinstance(component, torch.nn.Module) or not lora_layers(component):
        yield
        return
    plain = plain_state_dict(component)
    had_flag = "_hf_peft_config_loaded" in component.__dict__
    flag = component.__dict__.get("_hf_peft_config_loaded")
    object.__setattr__(component, "state_dict", lambda *args, **kwargs: dict(plain))
    object.__setattr__(component, "_hf_peft_config_loaded", False)
    try:
        yield
    finally:
        del component.__dict__["state_dict"]
        if had_flag:
            object.__setattr__(component, "_hf_peft_config_loaded", flag)
        else:
            del component.__dict__["_hf_peft_config_loaded"]
