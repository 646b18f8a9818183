"""A pipeline's calls and its changes of shared models exclude each other (``components.model_calls``).

A pipeline call runs on all of the pipeline's models from its start to its end; a LoRA or IP-Adapter call
changes some of them, and waits for the calls running on those in other threads (new calls wait for it). This
holds with auto offload on or off, through a manager (its ``wait_timeout``) or without one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from components.model_calls import DEFAULT_WAIT_TIMEOUT, MODEL_CALLS

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["changes_models", "running"]

Method = TypeVar("Method", bound=Callable[..., Any])


def _timeout(pipe: ModularPipeline) -> float:
    cm = pipe.components_manager
    return DEFAULT_WAIT_TIMEOUT if cm is None else cm.wait_timeout


def _models(pipe: ModularPipeline, names: Iterable[str] | None = None) -> list[torch.nn.Module]:
    """The pipeline's loaded models (those named, or all)."""
    components = pipe._components
    chosen = components if names is None else {name: components.get(name) for name in names}
    return [obj for obj in chosen.values() if isinstance(obj, torch.nn.Module)]


def running(pipe: ModularPipeline, also: Iterable[Any] = ()) -> AbstractContextManager[None]:
    """The context one call of ``pipe`` runs in: on all of its models and the models in ``also`` (a preview
    decoder: a removal of it waits for the call); it first waits for their changes."""
    models = [*_models(pipe), *(m for m in also if isinstance(m, torch.nn.Module))]
    return MODEL_CALLS.running(models, f"{type(pipe).__name__} call", _timeout(pipe))


def changes_models(names: Callable[[ModularPipeline], Iterable[str] | None]) -> Callable[[Method], Method]:
    """Runs a pipeline method as a change of the models ``names(pipe)`` names (``None``: all of them).

    Raises (before the method runs): ``offload.OffloadTimeoutError`` when calls on them still ran after the
    wait timeout, ``RuntimeError`` when called from inside a call of the pipeline in this thread.
    """

    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        def changed(self: Any, *args: Any, **kwargs: Any) -> Any:
            with MODEL_CALLS.changing(_models(self, names(self)), f"{method.__name__}()", _timeout(self)):
                return method(self, *args, **kwargs)

        return changed  # type: ignore[return-value]

    return decorate
