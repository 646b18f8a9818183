"""An IP-Adapter scale set from inside a call holds for the rest of that call only.

diffusers' ``IPAdapterScaleCutoffCallback`` calls ``pipeline.set_ip_adapter_scale(0.0)`` from a step callback. The
classic pipeline owns its UNet, so the change stays after the call. Here the denoiser may be shared by several
pipelines and calls (a manager, threads), and ``ModularPipeline.set_ip_adapter_scale`` is a change of a shared
model, refused inside a call. So the call's view of the pipeline (``CallComponents.set_ip_adapter_scale``)
computes the new scales with the family's own ``set_ip_adapter_scale`` on stand-ins of the attention processors
(the real ones are untouched), and keeps them in a context variable of the calling thread for the rest of the
call. Every IP-Adapter processor reads its ``scale`` through :class:`CallScopedScale`: the running call's scale
where it set one, else the processor's own. Other threads' calls and the next call see the processor's own.
"""

from __future__ import annotations

import copy
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from modular.adapters.ip_adapter import IPAdapterError, _ip_processors, _loader_and_denoiser, _target

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["CallScopedScale", "set_call_ip_adapter_scale"]

#: Per IP-Adapter processor, the scale the running call set (``None``: the call set none).
_CALL_SCALES: ContextVar[dict[Any, Any] | None] = ContextVar("call_ip_adapter_scales", default=None)


class CallScopedScale:
    """The ``scale`` attribute of an IP-Adapter attention processor: the running call's where it set one (in this
    thread), else the processor's own (``set_ip_adapter_scale`` outside a call sets that)."""

    def __get__(self, processor: Any, owner: type | None = None) -> Any:
        if processor is None:
            return self
        scales = _CALL_SCALES.get()
        if scales is not None and processor in scales:
            return scales[processor]
        return processor.__dict__["scale"]

    def __set__(self, processor: Any, value: Any) -> None:
        processor.__dict__["scale"] = value


_SCOPED_CLASSES: dict[type, type] = {}


def _read_through_the_call(processor: Any) -> None:
    """Makes `processor` read its scale through :class:`CallScopedScale` (a subclass of its own class, which
    changes nothing until a call sets a scale: a thread running it meanwhile reads the same values)."""
    cls = type(processor)
    if isinstance(cls.__dict__.get("scale"), CallScopedScale):
        return
    scoped = _SCOPED_CLASSES.get(cls)
    if scoped is None:
        namespace = {
            "scale": CallScopedScale(),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
        }
        scoped = _SCOPED_CLASSES[cls] = type(cls.__name__, (cls,), namespace)
    processor.__class__ = scoped


class _StandIn:
    """The denoiser as the family's ``set_ip_adapter_scale`` sees it: its own, except ``attn_processors``."""

    def __init__(self, denoiser: Any, processors: dict[str, Any]) -> None:
        self.__dict__["_denoiser"] = denoiser
        self.__dict__["attn_processors"] = processors

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_denoiser"], name)


def set_call_ip_adapter_scale(pipe: ModularPipeline, scale: Any, token: Token | None) -> Token:
    """Sets the IP-Adapter scale of the running call's remaining steps (as the family's ``set_ip_adapter_scale``
    reads `scale`); returns the token that ends it (``end_call_ip_adapter_scale``), `token` when one was given.

    Raises:
        IPAdapterError: no IP-Adapter is loaded, or `scale` does not fit the loaded adapters (nothing changes).
    """
    loader, denoiser_name, denoiser = _loader_and_denoiser(pipe, "set_ip_adapter_scale")
    processors = _ip_processors(denoiser)
    if not processors:
        msg = f"set_ip_adapter_scale: no IP-Adapter is loaded into {denoiser_name!r}; call load_ip_adapter(...) first"
        raise IPAdapterError(msg)
    stand_ins = {}
    for name, processor in processors.items():
        stand_in = copy.copy(processor)  # shares the weights; gets its own scale below
        stand_in.__dict__["scale"] = copy.deepcopy(processor.scale)  # the call's scale so far
        stand_ins[name] = stand_in
    try:
        loader.set_ip_adapter_scale(_target(loader, denoiser_name, _StandIn(denoiser, stand_ins)), scale)
    except Exception as error:
        msg = f"set_ip_adapter_scale: scale {scale!r} does not fit the loaded IP-Adapter(s) ({error})"
        raise IPAdapterError(msg) from error
    for processor in processors.values():
        _read_through_the_call(processor)
    scales = dict(_CALL_SCALES.get() or {})
    scales.update({processors[name]: stand_in.__dict__["scale"] for name, stand_in in stand_ins.items()})
    new_token = _CALL_SCALES.set(scales)
    return new_token if token is None else token


def end_call_ip_adapter_scale(token: Token | None) -> None:
    """Ends the call's IP-Adapter scales (the processors' own hold again); a no-op without a token."""
    if token is not None:
        _CALL_SCALES.reset(token)
