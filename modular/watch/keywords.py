"""The watching keywords of one call (``callback_on_step_end=``, ``cancel=``, ``on_progress=``, previews),
checked before anything runs, and the watch they make."""

from __future__ import annotations

from typing import Any

from modular.watch.watch import DEFAULT_TENSOR_INPUTS, CallWatch

__all__ = ["call_watch_of"]


def _callback_object_inputs(callback: Any) -> list[str] | None:
    """A diffusers ``PipelineCallback`` / ``MultiPipelineCallbacks`` names its own tensors (as in the classic
    pipelines, which then ignore ``callback_on_step_end_tensor_inputs``); ``None`` for a plain function."""
    from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

    if isinstance(callback, PipelineCallback | MultiPipelineCallbacks):
        return list(callback.tensor_inputs)
    return None


def call_watch_of(
    callback_on_step_end: Any = None,
    callback_on_step_end_tensor_inputs: Any = None,
    cancel: Any = None,
    on_progress: Any = None,
    preview_every: Any = None,
    on_preview: Any = None,
    preview_decoder: Any = None,
) -> CallWatch | None:
    """The watch for one call's keywords, checked before anything runs; ``None`` when none is given.

    Raises:
        TypeError: a callback that is not callable, tensor inputs that are not a list of names, a cancel
            without ``is_set()``, a ``preview_every`` that is not an int, a ``preview_decoder`` that is not a
            model with ``decode`` and a config with ``scaling_factor``.
        ValueError: ``preview_every`` below 1, or a preview keyword without ``on_preview``.
    """
    given = (callback_on_step_end, callback_on_step_end_tensor_inputs, cancel, on_progress, on_preview)
    if all(value is None for value in given) and preview_every is None and preview_decoder is None:
        return None
    if callback_on_step_end is not None and not callable(callback_on_step_end):
        msg = (
            f"callback_on_step_end must be callable as callback(pipeline, step_index, timestep, callback_kwargs) "
            f"-> dict, got a {type(callback_on_step_end).__name__}"
        )
        raise TypeError(msg)
    names = callback_on_step_end_tensor_inputs
    if callback_on_step_end is not None:
        own = _callback_object_inputs(callback_on_step_end)
        names = names if own is None else own
    if names is None:
        names = list(DEFAULT_TENSOR_INPUTS)
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        msg = (
            f"callback_on_step_end_tensor_inputs must be a list of tensor names such as ['latents'], got "
            f"{names!r}"
        )
        raise TypeError(msg)
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        msg = (
            f"cancel must be a threading.Event or a modular.CancelToken (anything with is_set()), got a "
            f"{type(cancel).__name__}"
        )
        raise TypeError(msg)
    for name, value in (("on_progress", on_progress), ("on_preview", on_preview)):
        if value is not None and not callable(value):
            msg = f"{name} must be callable with one argument, got a {type(value).__name__}"
            raise TypeError(msg)
    if preview_every is not None:
        if isinstance(preview_every, bool) or not isinstance(preview_every, int):
            msg = f"preview_every must be an int (a preview every that many steps), got {preview_every!r}"
            raise TypeError(msg)
        if preview_every < 1:
            msg = f"preview_every must be 1 or more (a preview every that many steps), got {preview_every}"
            raise ValueError(msg)
    if preview_decoder is not None:
        _check_preview_decoder(preview_decoder)
    if on_preview is None and (preview_every is not None or preview_decoder is not None):
        given_name = "preview_every" if preview_every is not None else "preview_decoder"
        msg = f"{given_name} was given without on_preview: pass on_preview=fn, which receives each Preview"
        raise ValueError(msg)
    return CallWatch(
        callback=callback_on_step_end,
        tensor_inputs=tuple(names),
        tensor_inputs_given=callback_on_step_end_tensor_inputs is not None
        or _given_object_inputs(callback_on_step_end),
        cancel=cancel,
        on_progress=on_progress,
        preview_every=(preview_every or 1) if on_preview is not None else None,
        on_preview=on_preview,
        preview_decoder=preview_decoder,
    )


def _check_preview_decoder(decoder: Any) -> None:
    """A preview decoder is a model with ``decode(latents).sample`` and a config with ``scaling_factor``, as
    diffusers' VAEs (``AutoencoderTiny`` above all) are."""
    import torch

    config = getattr(decoder, "config", None)
    if (
        not isinstance(decoder, torch.nn.Module)
        or not callable(getattr(decoder, "decode", None))
        or not isinstance(getattr(config, "scaling_factor", None), int | float)
    ):
        msg = (
            "preview_decoder must be a torch.nn.Module with decode(latents).sample and a config with "
            "scaling_factor, such as diffusers.AutoencoderTiny.from_pretrained('madebyollin/taesd'), got a "
            f"{type(decoder).__name__}"
        )
        raise TypeError(msg)


def _given_object_inputs(callback: Any) -> bool:
    return callback is not None and _callback_object_inputs(callback) is not None
