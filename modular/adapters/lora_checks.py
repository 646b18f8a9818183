"""Checks of the LoRA calls made before diffusers runs, so that a bad call changes nothing.

diffusers warns and goes on where these refuse: keys that go to no model of the pipeline are dropped, a
per-component weight for a component without LoRA is ignored. Each error names the call, what is wrong and
the fix.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = [
    "adapters_of",
    "all_adapters",
    "check_keys",
    "checked_weights",
    "chosen_models",
    "known_names",
    "new_adapter_name",
]

Models = Mapping[str, torch.nn.Module | None]


def adapters_of(model: torch.nn.Module | None) -> list[str]:
    """The names of the adapters peft loaded into ``model`` (empty for ``None``)."""
    config = getattr(model, "peft_config", None) if model is not None else None
    return list(config) if isinstance(config, dict) else []


def all_adapters(models: Models) -> list[str]:
    """Every adapter name in ``models``, once each, in the order first found."""
    names: list[str] = []
    for model in models.values():
        names.extend(name for name in adapters_of(model) if name not in names)
    return names


def new_adapter_name(adapter_name: str | None, models: Models) -> str:
    """The name a new adapter gets: ``adapter_name`` if free, else (for ``None``) the first free ``default_<n>``.

    One name for every model: diffusers would number each model's default on its own.
    """
    in_use = {
        name: [key for key, model in models.items() if name in adapters_of(model)]
        for name in all_adapters(models)
    }
    if adapter_name is None:
        count = 0
        while f"default_{count}" in in_use:
            count += 1
        return f"default_{count}"
    if not isinstance(adapter_name, str) or not adapter_name or "." in adapter_name:
        msg = f"load_lora_weights: adapter_name must be a non-empty name without '.' (got {adapter_name!r})"
        raise ValueError(msg)
    if adapter_name in in_use:
        msg = (
            f"load_lora_weights: adapter name {adapter_name!r} is already in use in {in_use[adapter_name]}; pass "
            f"another adapter_name, or pipe.delete_adapters({adapter_name!r}) first"
        )
        raise ValueError(msg)
    return adapter_name


def check_keys(loader: Any, models: Models, source: str, state_dict: dict) -> None:
    """Every converted key must go to a model of the pipeline: diffusers would drop the others silently."""
    loaded = [key for key, model in models.items() if model is not None]
    prefixes = sorted({key.split(".", 1)[0] for key in state_dict})
    unmatched = [prefix for prefix in prefixes if prefix not in loaded]
    if not state_dict or unmatched:
        found = f"keys starting with {unmatched}" if unmatched else "no keys"
        msg = (
            f"load_lora_weights: {source} has {found}, which match no component of this pipeline; "
            f"{loader.__name__} loads into {loader._lora_loadable_modules} and this pipeline has {loaded}. "
            "Pass a LoRA made for this model family (or a state dict without those keys)."
        )
        raise ValueError(msg)


def known_names(adapter_names: str | Iterable[str], models: Models, what: str) -> list[str]:
    """The adapter names as a list, each loaded in ``models`` and named once."""
    names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
    known = all_adapters(models)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            msg = f"{what}: no adapter named {name!r}{hint} (loaded: {known})"
            raise ValueError(msg)
    if len(set(names)) != len(names):
        msg = f"{what}: adapter names repeat ({names}); name each adapter once"
        raise ValueError(msg)
    return names


def checked_weights(adapter_weights: Any, names: list[str], loader: Any) -> Any:
    """``adapter_weights`` of ``set_adapters``, checked: one per adapter, numbers or dicts of loadable models."""
    weights = adapter_weights if isinstance(adapter_weights, list) else [adapter_weights] * len(names)
    if len(weights) != len(names):
        msg = (
            f"set_adapters: adapter_weights has {len(weights)} weights for {len(names)} adapters {names}; give "
            "one weight per adapter, or one number for all"
        )
        raise ValueError(msg)
    for weight in weights:
        if isinstance(weight, Mapping):
            unknown = sorted(set(weight) - set(loader._lora_loadable_modules))
            if unknown:
                msg = (
                    f"set_adapters: adapter_weights names {unknown}, which take no LoRA; per-component weights "
                    f"are for {loader._lora_loadable_modules}"
                )
                raise ValueError(msg)
        elif weight is not None and (isinstance(weight, bool) or not isinstance(weight, numbers.Real)):
            msg = f"set_adapters: a weight is a number, None or a per-component dict (got {weight!r})"
            raise TypeError(msg)
    return adapter_weights


def chosen_models(
    models: dict[str, torch.nn.Module | None], components: list[str] | None, loader: Any, what: str
) -> dict[str, torch.nn.Module | None]:
    """The models named by ``components`` (all of ``models``, those holding a LoRA, when ``None``)."""
    if components is None:
        return models
    names = [components] if isinstance(components, str) else list(components)
    for name in names:
        if name not in loader._lora_loadable_modules:
            msg = f"{what}: {name!r} takes no LoRA; components are among {loader._lora_loadable_modules}"
            raise ValueError(msg)
        if name not in models:
            msg = f"{what}: {name!r} holds no LoRA (LoRA is loaded in {list(models)})"
            raise ValueError(msg)
    return {name: models[name] for name in names}
