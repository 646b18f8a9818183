"""The call's LoRA scale on the text encoders, as the classic pipelines apply it.

A classic pipeline called with ``cross_attention_kwargs={"scale": s}`` (Flux: ``joint_attention_kwargs``)
scales the LoRA layers of its text encoders by ``s`` while it encodes the prompt, with diffusers'
``scale_lora_layers``; the denoiser scales its own inside its forward. ``lora_scaled_encoders`` does the same
around a family's prompt encoding, so a LoRA that covers the text encoders gives the classic images at every
scale.

peft keeps the scale on the layers, so scaling changes the model in place, and a text encoder is shared by
every pipeline of the manager. Two rules keep that safe:

- the scale is undone however the encoding ends, and exactly: each layer's ``scaling`` is put back as it was,
  rather than divided back (diffusers' ``unscale_lora_layers`` resets a layer to the adapter's base scale after
  a scale of 0, which drops the weight ``set_adapters`` gave it);
- the encoding holds the encoder's lock while it runs, at any scale, whenever the encoder has LoRA layers: a
  thread encoding at scale 1.3 and one at 0.5 (or at none) on one shared encoder take turns, so neither sees
  the other's scale. Encoders without LoRA layers take no lock.

The denoiser scales itself inside each forward (diffusers' ``apply_lora_scale``), as in the classic pipelines,
so its images match theirs; but after a forward at scale 0 diffusers resets every layer to the adapter's base
scale, dropping the weight ``set_adapters`` gave it, for every later call. ``denoiser_weights_kept_at_scale_zero``
puts the denoiser's layer scales back after a denoising loop at scale 0 (any other scale is undone by diffusers
itself). Two threads calling one shared denoiser at different scales at the same moment are not kept apart:
its scaling happens inside diffusers' forward (docs/adapters.md says so).
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from diffusers.utils import scale_lora_layers

if TYPE_CHECKING:
    from peft.tuners.tuners_utils import BaseTunerLayer

__all__ = ["denoiser_weights_kept_at_scale_zero", "lora_scale_from", "lora_scaled_encoders"]

# One lock per encoder object, shared by every pipeline that holds it; dropped with the encoder.
_locks: weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def _lock_of(model: torch.nn.Module) -> threading.RLock:
    with _locks_guard:
        lock = _locks.get(model)
        if lock is None:
            lock = _locks[model] = threading.RLock()
        return lock


def lora_scale_from(
    attention_kwargs: Mapping[str, Any] | None, input_name: str, block_name: str
) -> float | None:
    """The LoRA scale a call gives in `attention_kwargs` (its ``"scale"``), or None when it gives none.

    Raises:
        TypeError: the scale is not a number.
    """
    if attention_kwargs is None or "scale" not in attention_kwargs:
        return None
    scale = attention_kwargs["scale"]
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        msg = (
            f"{block_name}: {input_name}['scale'] is the LoRA scale and must be a number "
            f"(got {scale!r} that is a {type(scale).__name__}); pass e.g. {{'scale': 0.5}}"
        )
        raise TypeError(msg)
    return float(scale)


def _lora_layers(model: torch.nn.Module) -> list[BaseTunerLayer]:
    # peft makes every LoRA layer: until something imported it there is none, and importing it here would
    # cost every first call seconds (peft imports transformers' models).
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    if tuners is None:
        return []
    return [module for module in model.modules() if isinstance(module, tuners.BaseTunerLayer)]


@contextlib.contextmanager
def _scalings_kept(layers: Iterable[BaseTunerLayer]) -> Iterator[None]:
    """On leaving, even by an error, each layer's ``scaling`` is exactly as it was on entering (put back, not
    divided back)."""
    saved = [(layer, dict(layer.scaling)) for layer in layers if hasattr(layer, "scaling")]
    try:
        yield
    finally:
        for layer, scaling in saved:
            layer.scaling.clear()
            layer.scaling.update(scaling)


@contextlib.contextmanager
def lora_scaled_encoders(encoders: Iterable[torch.nn.Module | None], scale: float | None) -> Iterator[None]:
    """Inside, the LoRA layers of `encoders` are scaled by `scale` (none: as they are), each encoder with LoRA
    layers held under its lock; on leaving, even by an error, every layer's scale is exactly as before."""
    with contextlib.ExitStack() as stack:
        held = []
        # One order for every thread (by id), so two calls holding two shared encoders cannot deadlock.
        for encoder in sorted({id(e): e for e in encoders if e is not None}.values(), key=id):
            layers = _lora_layers(encoder)
            if layers:
                stack.enter_context(_lock_of(encoder))
                held.append((encoder, layers))
        if scale is None or scale == 1.0:
            yield
            return
        with _scalings_kept(layer for _, layers in held for layer in layers):
            for encoder, _ in held:
                scale_lora_layers(encoder, scale)  # the classic pipelines' own arithmetic: bit for bit
            yield


@contextlib.contextmanager
def denoiser_weights_kept_at_scale_zero(
    denoisers: Iterable[object], attention_kwargs: Mapping[str, Any] | None
) -> Iterator[None]:
    """Inside, a denoising loop runs; with a LoRA scale of 0 in `attention_kwargs`, the LoRA layers of the
    `denoisers` (the torch modules among them) get their scales back on leaving, even by an error."""
    scale = attention_kwargs.get("scale") if isinstance(attention_kwargs, Mapping) else None
    if scale is None or isinstance(scale, bool) or scale != 0:
        yield
        return
    with _scalings_kept(
        layer for model in denoisers if isinstance(model, torch.nn.Module) for layer in _lora_layers(model)
    ):
        yield
