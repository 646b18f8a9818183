"""Which components a bare ``load_components()`` loads: those not loaded yet, or loaded from another spec.

The peer's rule: a component that is already loaded (by an earlier ``load_components`` or set with
``update_components(x=mine)``) is kept unless it is named explicitly or what it would load from changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from components.load_id import get_load_id
from components.load_kwargs import split_load_kwargs
from modular.pipeline.loading import options_for

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["names_to_load"]


def names_to_load(pipe: ModularPipeline, kwargs: dict[str, Any]) -> list[str]:
    """The components ``pipe.load_components(**kwargs)`` loads when no names are given.

    Every ``from_pretrained`` component with a repo (after the loading fields in ``kwargs``) that is not
    loaded, or whose loaded object carries another load ID than the spec now gives (the spec changed).
    Load options such as ``torch_dtype`` do not count as a change: name a component to reload it with them.
    """
    names = []
    for name, spec in pipe._specs.items():
        if spec.default_creation_method != "from_pretrained":
            continue
        fields, _ = split_load_kwargs(options_for(name, kwargs), f"load_components() for {name!r}")
        target = attrs.evolve(spec, **fields) if fields else spec
        if not target.pretrained_model_name_or_path:
            continue
        loaded = pipe._components.get(name)
        if loaded is None or get_load_id(loaded) != target.load_id:
            names.append(name)
    return names
