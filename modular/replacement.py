"""What ``update_components`` accepts in place of a component the blocks declare."""

from __future__ import annotations

from components import ComponentSpec

__all__ = ["replacement_type"]


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
