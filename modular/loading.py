"""``load_components``: per-component options, reuse through the manager, all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from components.load_kwargs import split_load_kwargs

if TYPE_CHECKING:
    from components import ComponentSpec

    from .pipeline import ModularPipeline

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


def load_all(
    pipe: ModularPipeline, names: list[str] | str | None, kwargs: dict[str, Any]
) -> dict[str, tuple]:
    """Load the named components; on any failure, unregister what this call added and re-raise."""
    cm = pipe._components_manager
    plans: dict[str, tuple[ComponentSpec, dict[str, Any]]] = {}
    for name in _names(pipe, names):
        # Every keyword is checked before anything loads (an unknown one raises TypeError here).
        fields, options = split_load_kwargs(options_for(name, kwargs), f"load_components() for {name!r}")
        spec = attrs.evolve(pipe._specs[name], **fields) if fields else pipe._specs[name]
        if not spec.pretrained_model_name_or_path:
            msg = (
                f"load_components: component {name!r} has no repo to load from; pass "
                f"pretrained_model_name_or_path={{'{name}': 'org/name'}} or make the pipeline from a repo"
            )
            raise ValueError(msg)
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
