"""The keyword arguments a classic diffusers pipeline class takes, found among a manager's components.

A classic pipeline (``FluxPipeline``, ``StableDiffusionPipeline``) names its components in its
``__init__``; the manager's components carry the same names, so the arguments can be inferred.
"""

from __future__ import annotations

import inspect
from typing import Any

from .errors import ComponentNotFoundError

__all__ = ["classic_pipeline_kwargs"]


def classic_pipeline_kwargs(
    manager: Any, pipeline_class: type, collection: str | None = None
) -> dict[str, Any]:
    """``{parameter: component}`` for every ``__init__`` parameter of ``pipeline_class`` the manager holds.

    A parameter is matched by component name, within ``collection`` when one is given. One the manager
    does not hold is left out when it has a default, and is ``None`` when the class lists it in
    ``_optional_components`` (as ``StableDiffusionPipeline`` does its safety checker).

    Raises:
        TypeError: ``pipeline_class`` is not a class.
        ValueError: several components of one name are in scope (pass ``collection=``).
        ComponentNotFoundError: a required component is not held (the message lists what is).
    """
    if not isinstance(pipeline_class, type):
        msg = f"components_for() takes a pipeline class such as FluxPipeline (got {pipeline_class!r})"
        raise TypeError(msg)
    optional = set(getattr(pipeline_class, "_optional_components", None) or ())
    scope = f"collection {collection!r}" if collection is not None else "the manager"
    kwargs: dict[str, Any] = {}
    missing = []
    for param in inspect.signature(pipeline_class).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        ids = manager.get_ids(param.name, collection)
        if len(ids) > 1:
            msg = (
                f"{pipeline_class.__name__}: {scope} holds {len(ids)} components named {param.name!r} ({ids}); "
                "pass collection=... to choose one"
            )
            raise ValueError(msg)
        if ids:
            kwargs[param.name] = manager.get_components_by_ids(ids)[param.name]
        elif param.name in optional:
            kwargs[param.name] = None
        elif param.default is param.empty:
            missing.append(param.name)
    if missing:
        held = sorted({component_id.rsplit("_", 1)[0] for component_id in manager.get_ids(None, collection)})
        msg = (
            f"{pipeline_class.__name__} needs {missing}, which {scope} does not hold (it holds {held}); load a "
            "pipeline that has them through this manager, or add them with add(name, component)"
        )
        raise ComponentNotFoundError(msg)
    return kwargs
