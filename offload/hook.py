"""The forward hook: before a model runs, make it resident, then move its inputs to the device.

It is an accelerate ``ModelHook`` added with ``add_hook_to_module``, so a direct call triggers it and
so do diffusers' VAE ``encode``/``decode``, which call ``module._hf_hook.pre_forward(module)`` through
``apply_forward_hook`` (they receive no inputs that way; the pipeline sends latents to the device).
The wrapped forward also catches an out-of-memory error once: the engine evicts every other model
and the forward runs again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
from accelerate.utils import send_to_device

if TYPE_CHECKING:
    from offload.engine import OffloadEngine

__all__ = ["OffloadHook", "check_no_foreign_hook", "install_hook", "remove_hook"]


class OffloadHook(ModelHook):
    """Asks ``engine`` to make ``model_id`` resident before each forward, then sends inputs to the device.

    Args:
        engine: The engine that owns the ledger and the strategy.
        model_id: The id the model is attached under.
    """

    def __init__(self, engine: OffloadEngine, model_id: str):
        self.engine = engine
        self.model_id = model_id
        # The forward accelerate wrapped, restored on removal.
        self.original_forward: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        return f"OffloadHook(model_id={self.model_id!r}, device={self.engine.execution_device})"

    @property
    def execution_device(self) -> torch.device:
        """Where the model runs; pipelines read it (as from accelerate's hooks) to place their tensors."""
        return self.engine.execution_device

    def pre_forward(self, module, *args, **kwargs):
        self.engine.ensure_resident(self.model_id)
        device = self.engine.execution_device
        return send_to_device(args, device), send_to_device(kwargs, device)


def check_no_foreign_hook(module: torch.nn.Module, model_id: str) -> None:
    """Raise ValueError if ``module`` already carries an accelerate hook (offload would replace it)."""
    existing = getattr(module, "_hf_hook", None)
    if existing is not None:
        msg = (
            f"model {model_id!r} already has an accelerate hook ({existing!r}); auto offload would "
            "replace it. Remove it first with accelerate.hooks.remove_hook_from_module(module), or leave "
            "this model out of auto offload."
        )
        raise ValueError(msg)


def install_hook(module: torch.nn.Module, hook: OffloadHook) -> None:
    """Add ``hook`` to ``module`` and wrap the original forward with the out-of-memory retry.

    Raises:
        ValueError: ``module`` already carries another accelerate hook.
    """
    check_no_foreign_hook(module, hook.model_id)
    add_hook_to_module(module, hook)
    # accelerate keeps the forward as a plain attribute; torch types module attributes as Tensor | Module.
    original = cast("Callable[..., Any]", module._old_forward)
    hook.original_forward = original
    engine, model_id = hook.engine, hook.model_id

    @functools.wraps(original)
    def forward_with_retry(*args, **kwargs):
        return engine.run_forward(model_id, original, args, kwargs)

    module._old_forward = forward_with_retry  # type: ignore[assignment]  # a plain attribute (see above)


def remove_hook(module: torch.nn.Module) -> None:
    """Remove the offload hook from ``module`` and restore its own forward."""
    hook = getattr(module, "_hf_hook", None)
    if isinstance(hook, OffloadHook) and hook.original_forward is not None:
        module._old_forward = hook.original_forward  # type: ignore[assignment]  # a plain attribute, as in install_hook
    remove_hook_from_module(module)
