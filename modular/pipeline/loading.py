"""``load_components``: per-component options, reuse through the manager, all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from components.load_kwargs import split_load_kwargs
from components.remote_code import consent_for_pipeline

if TYPE_CHECKING:
    from components import ComponentSpec
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["load_all", "options_for"]


def options_for(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The options for one component: a plain value applies to all, a dict is looked up by name then ``"default"``."""
    options = {}
    for key, value in kwargs.items():
        if isinstance(value, dict):
            if name in value:
                options[key] = value[name]
            elif "default" in value:
                options[key] = value["default"]
        else:
            options[key] = value
    return options


def _names(pipe: ModularPipeline, names: list[str] | str | None) -> list[str]:
    specs = pipe._specs
    if names is None:
        return [
            n
            for n, s in specs.items()
            if s.default_creation_method == "from_pretrained" and s.pretrained_model_name_or_path
        ]
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in specs]
    if unknown:
        msg = f"load_components: unknown component(s) {unknown}; this pipeline's components are {list(specs)}"
        raise KeyError(msg)
    return names


def _check_quantized_names(pipe: ModularPipeline, config: Any) -> None:
    """A PipelineQuantizationConfig that names a component this pipeline lacks is refused (diffusers only
    warns), since a misspelt name would leave the intended component unquantized."""
    from diffusers.quantizers import PipelineQuantizationConfig

    configs = config.values() if isinstance(config, dict) else [config]
    for each in configs:
        if not isinstance(each, PipelineQuantizationConfig):
            continue
        named = list(each.quant_mapping or []) + list(each.components_to_quantize or [])
        unknown = sorted({name for name in named if name not in pipe._specs})
        if unknown:
            msg = (
                f"load_components: the PipelineQuantizationConfig names component(s) {unknown} that this "
                f"pipeline does not have; its components are {list(pipe._specs)}. Fix the names in quant_mapping "
                f"or components_to_quantize."
            )
            raise ValueError(msg)


def load_all(
    pipe: ModularPipeline, names: list[str] | str | None, kwargs: dict[str, Any]
) -> dict[str, tuple]:
    """Load the named components; on any failure, unregister what this call added and re-raise."""
    cm = pipe._components_manager
    _check_quantized_names(pipe, kwargs.get("quantization_config"))
    plans: dict[str, tuple[ComponentSpec, dict[str, Any]]] = {}
    for name in _names(pipe, names):
        # Every keyword is checked before anything loads (an unknown one raises TypeError here).
        fields, options = split_load_kwargs(options_for(name, kwargs), f"load_components() for {name!r}")
        if "trust_remote_code" in options:  # True: the pipeline's own repo only (components/remote_code.py)
            options["trust_remote_code"] = consent_for_pipeline(
                options["trust_remote_code"],
                pipe.pretrained_model_name_or_path,
                f"load_components() for {name!r}",
            )
        spec = attrs.evolve(pipe._specs[name], **fields) if fields else pipe._specs[name]
        if not spec.pretrained_model_name_or_path:
            msg = (
                f"load_components: component {name!r} has no repo to load from; pass "
                f"pretrained_model_name_or_path={{'{name}': 'org/name'}} or make the pipeline from a repo"
            )
            raise ValueError(msg)
        if options.get("quantization_config") is not None:
            # Resolved before anything loads: a config that does not fit one component fails the whole call.
            options["quantization_config"] = spec.resolve_quantization(**options)
        plans[name] = (spec, options)
    loaded: dict[str, tuple] = {}
    registered_before = set(cm.components) if cm is not None else set()
    try:
        for name, (spec, options) in plans.items():
            obj = (
                spec.load(**options)
                if cm is None
                else cm.get_or_load(spec, collection=pipe._collection, **options)
            )
            loaded[name] = (spec, obj)
    except BaseException:
        # Undo this call's registrations only: objects that were in the manager before stay.
        if cm is not None:
            for _, obj in loaded.values():
                component_id = cm.get_id(obj)
                if component_id is not None and component_id not in registered_before:
                    cm.remove(component_id)
        raise
    return loaded
