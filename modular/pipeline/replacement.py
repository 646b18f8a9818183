"""What ``update_components`` accepts in place of a component the blocks declare."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components import ComponentSpec
from modular.framework.block import ModularPipelineBlocks
from modular.framework.planning import every_block

__all__ = ["check_replacements", "replacement_type"]


def replacement_type(spec: ComponentSpec) -> type | None:
    """The class an object given for `spec` must be an instance of.

    A component made from a config is one of a family of interchangeable classes that share one kind of config
    file: the declared class's nearest base that names that file (diffusers' ``config_name``) is what is
    accepted. So a ``ClassifierFreeGuidance`` spec takes any diffusers guider (``BaseGuidance``), while a class
    that names its own file (an image processor) takes only itself and its subclasses. Any other spec takes its
    declared class.
    """
    declared = spec.type_hint
    if declared is None or spec.default_creation_method != "from_config":
        return declared
    owners = [cls for cls in declared.__mro__ if "config_name" in vars(cls)]
    return owners[0] if owners else declared


def check_replacements(
    blocks: ModularPipelineBlocks, specs: Mapping[str, ComponentSpec], values: Mapping[str, Any]
) -> None:
    """Checks objects given for components (by name) before any is set: each must be of the class the blocks
    accept (``replacement_type``; the pipeline's spec when no block declares it), and every block that declares
    the component and can tell what it cannot use (an optional ``check_component(name, obj)`` method, e.g. a
    denoiser refusing a guider whose predictions it cannot make) must accept it. ``None`` is always accepted.

    Raises:
        TypeError: an object of the wrong class (the message names the component and the accepted class).
        ValueError: (or another error) what a block's ``check_component`` raises.
    """
    declared = {spec.name: replacement_type(spec) for spec in blocks.expected_components}
    for name, value in values.items():
        hint = declared.get(name) or specs[name].type_hint
        if value is not None and hint is not None and not isinstance(value, hint):
            msg = f"update_components: {name!r} must be a {hint.__name__} (got a {type(value).__name__})"
            raise TypeError(msg)
    for block in every_block(blocks):
        check = getattr(block, "check_component", None)
        if check is None:
            continue
        own = {spec.name for spec in block.expected_components}
        for name, value in values.items():
            if value is not None and name in own:
                check(name, value)
