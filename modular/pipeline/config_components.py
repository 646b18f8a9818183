"""Components made from a config (guiders, image processors) in a saved index, in the peer's layout.

The peer lists no from-config component in ``modular_model_index.json``: a pipeline makes them from its blocks'
specs. A component the user changed (``update_components(guider=PerturbedAttentionGuidance(...))``) would come
back as the blocks' default after a save and a load, so a save writes each component whose class or config
differs from what its blocks make, as the peer's loader reads a guider saved on its own: its config file in
``<folder>/<name>`` (``guider_config.json``, written by its own ``save_pretrained``) and an entry
``[library, class, {"pretrained_model_name_or_path": null, "subfolder": "<name>", ..., "type_hint": [library,
class]}]``. The peer loads such an entry with the class's ``from_pretrained``; this project makes the
component from that config when the pipeline is made, so it stays each pipeline's own (never shared through
the manager, as a loaded component would be).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import attrs
from diffusers.configuration_utils import ConfigMixin, FrozenDict

from components import ComponentSpec
from modular.errors import IndexFileError
from modular.pipeline.replacement import replacement_type

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["changed_config_components", "config_spec_from_index"]


def changed_config_components(pipe: ModularPipeline) -> list[str]:
    """The from-config components whose class or config differs from what the pipeline's blocks make.

    Only diffusers config objects (``ConfigMixin``: guiders, image processors), which save and read their config.
    """
    declared = {spec.name: spec for spec in pipe.blocks.expected_components}
    changed = []
    for name, spec in pipe._specs.items():
        obj = pipe._components[name]
        default = declared.get(name)
        saves_config = isinstance(obj, ConfigMixin)  # a flag: diffusers' classes are Any to the type checker
        if spec.default_creation_method != "from_config" or default is None or not saves_config:
            continue
        made = _made_config(default)
        if _public(obj.config, made) != made or type(obj) is not default.type_hint:
            changed.append(name)
    return changed


def _public(config: Any, made: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config's public keys; with `made`, without those it took as defaults that `made` does not name: a
    base class registers them, not the class's own signature (Flux2ImageProcessor's resample, from
    VaeImageProcessor), so no spec can set them."""
    config = dict(config)
    defaulted = set(config.get("_use_default_values", ())) if made is not None else set()
    return {
        key: value
        for key, value in config.items()
        if not key.startswith("_") and not (key in defaulted and key not in (made or {}))
    }


def _made_config(spec: ComponentSpec) -> dict[str, Any]:
    """The config of what ``spec.create()`` makes: the class's defaults, overridden by the spec's config.

    Read from the signature rather than by making one: a guider logs a warning each time one is made.
    """
    assert spec.type_hint is not None  # a from-config spec is made from its class
    parameters = inspect.signature(spec.type_hint).parameters.values()
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return {**defaults, **_public(spec.config or {})}


def config_spec_from_index(declared: ComponentSpec, from_index: ComponentSpec, source: str) -> ComponentSpec:
    """The blocks' from-config spec made from the config an index entry points at (see the module docstring).

    Args:
        declared: The blocks' spec (``default_creation_method="from_config"``).
        from_index: The spec the index entry describes: its class and where its config file is.
        source: The index file, as errors name it.

    Raises:
        IndexFileError: the entry names a class that cannot stand in for the component, or its config file
            cannot be read; nothing has been made.
    """
    accepted = replacement_type(declared)
    cls: Any = from_index.type_hint or declared.type_hint  # a ConfigMixin once checked below
    where = f"{from_index.pretrained_model_name_or_path}/{from_index.subfolder or ''}".rstrip("/")
    if cls is None or accepted is None or not issubclass(cls, accepted):
        shown = "no class" if cls is None else f"{cls.__module__}.{cls.__qualname__}"
        problem = (
            f"entry {declared.name!r} declares {shown}, which cannot be the {declared.name!r} component: its "
            f"blocks take a {getattr(accepted, '__name__', accepted)}. Fix the entry's class, or remove the entry "
            f"to get the blocks' default"
        )
        raise IndexFileError(source, [problem])
    try:
        config = cls.load_config(
            from_index.pretrained_model_name_or_path,
            subfolder=from_index.subfolder or None,
            revision=from_index.revision,
        )
    except (OSError, ValueError) as error:
        problem = (
            f"entry {declared.name!r}: cannot read the {getattr(cls, 'config_name', 'config')} of "
            f"{cls.__name__} from {where} ({error}); save the pipeline again, or remove the entry to get the "
            f"blocks' default"
        )
        raise IndexFileError(source, [problem]) from error
    return attrs.evolve(declared, type_hint=cls, config=FrozenDict(_public(config)))
