"""Which classes may load one component: a class with ``from_pretrained`` that is not a whole pipeline."""

from __future__ import annotations

from .errors import ComponentLoadError, PipelineTypeError
from .importing import is_pipeline_type

__all__ = ["check_loadable_type"]


def check_loadable_type(name: str, cls: type, where: str) -> None:
    """Checks that ``cls`` loads one component with ``from_pretrained``, before anything is read.

    Raises:
        PipelineTypeError: ``cls`` is a whole pipeline, whose loader reads every folder of a repo (and their
            weights, pickle files included) past the checks made here on one component folder.
        ComponentLoadError: ``cls`` has no ``from_pretrained``.
    """
    if is_pipeline_type(cls):
        msg = (
            f"Component {name!r} from {where} is declared as {cls.__module__}.{cls.__qualname__}, a whole "
            f"pipeline, not a component: loading it would load another repo's components unchecked. Declare the "
            f"component's own class (e.g. a model, scheduler or tokenizer class) or type_hint=None, and load "
            f"the other pipeline's components through its own index."
        )
        raise PipelineTypeError(msg)
    try:
        loader = getattr(cls, "from_pretrained", None)
    except ImportError:  # diffusers' placeholder for a class whose backend is missing: let it raise on load
        return
    if not callable(loader):
        msg = (
            f"Component {name!r} from {where} is declared as {cls.__module__}.{cls.__qualname__}, which has no "
            f"from_pretrained to load it with. Declare a class that loads from a repo, or build the component "
            f"with ComponentSpec.create()."
        )
        raise ComponentLoadError(msg)
