"""The forward hook: before a model runs, make it resident, then move its inputs to the device.

It is an accelerate ``ModelHook`` added with ``add_hook_to_module``, so diffusers' VAE
``encode``/``decode`` trigger it too: they call ``module._hf_hook.pre_forward(module)`` through
``apply_forward_hook`` (they receive no inputs that way; the pipeline sends latents to the device).

The module's ``forward``, and every method that calls the hook's ``pre_forward`` itself (found by
what its code reads, so ``encode``/``decode`` without naming them), are replaced by functions that run
the whole call through ``OffloadEngine.run_forward``: the model counts as running from start to end
(no other thread evicts it; ``detach``/``close`` wait for it), and an out-of-memory error is caught
once: the engine evicts every other model and the call runs again. Those functions hold the hook
themselves rather than reading ``module._hf_hook`` after the forward, as accelerate's does. Its
``state_dict`` is replaced too, by one that reads the weights back from the host tier first, and its ``to``
by one that refuses a device move and converts dtypes through the engine (``offload.engine.conversions``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
from accelerate.utils import send_to_device

from offload.engine.conversions import guarded_to

if TYPE_CHECKING:
    from offload.engine.engine import OffloadEngine

__all__ = ["OffloadHook", "check_no_foreign_hook", "install_hook", "remove_hook"]


class OffloadHook(ModelHook):
    """Asks ``engine`` to make ``model_id`` resident before each forward, then sends inputs to the device.

    Args:
        engine: The engine that owns the ledger and the strategy.
        model_id: The id the model is attached under.
        device: Where a pinned model's inputs go (it runs where it stays); None: the engine's device.
    """

    def __init__(self, engine: OffloadEngine, model_id: str, device: torch.device | None = None):
        self.engine = engine
        self.model_id = model_id
        self.device = device
        # The forward accelerate wrapped, restored on removal.
        self.original_forward: Callable[..., Any] | None = None
        # Other methods replaced on the instance (diffusers' encode/decode), removed on removal.
        self.wrapped_methods: list[str] = []

    def __repr__(self) -> str:
        return f"OffloadHook(model_id={self.model_id!r}, device={self.engine.execution_device})"

    @property
    def execution_device(self) -> torch.device:
        """Where the model runs; pipelines read it (as from accelerate's hooks) to place their tensors."""
        return self.engine.execution_device if self.device is None else self.device

    @property
    def nbytes(self) -> int:
        """Bytes of the model's weights as its engine counts them: read from the ledger, no walk of its tensors."""
        return self.engine.nbytes(self.model_id)

    def pre_forward(self, module, *args, **kwargs):
        self.engine.ensure_resident(self.model_id)
        device = self.execution_device
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


def _calls_the_hook(function: object) -> bool:
    """True for a method that triggers the hook itself, as diffusers' ``apply_forward_hook`` wrapper does."""
    code = getattr(function, "__code__", None)
    return code is not None and {"_hf_hook", "pre_forward"} <= set(code.co_names)


def _hook_calling_methods(module: torch.nn.Module) -> list[str]:
    """Names of the methods of ``module``'s class, other than forward, that call the hook themselves."""
    names: dict[str, bool] = {}
    for klass in type(module).__mro__:  # read statically: no property or descriptor runs
        for name, attribute in vars(klass).items():
            if name not in names:
                names[name] = name != "forward" and not name.startswith("__") and _calls_the_hook(attribute)
    return [name for name, calls in names.items() if calls]


def install_hook(module: torch.nn.Module, hook: OffloadHook) -> None:
    """Add ``hook`` to ``module``; its forward and hook-calling methods then run through the engine.

    Raises:
        ValueError: ``module`` already carries another accelerate hook.
    """
    check_no_foreign_hook(module, hook.model_id)
    add_hook_to_module(module, hook)
    # accelerate keeps the forward as a plain attribute; torch types module attributes as Tensor | Module.
    original = cast("Callable[..., Any]", module._old_forward)
    hook.original_forward = original
    engine, model_id = hook.engine, hook.model_id

    def pre_forward(*args, **kwargs):
        return hook.pre_forward(module, *args, **kwargs)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        return hook.post_forward(module, engine.run_forward(model_id, original, args, kwargs, pre_forward))

    module.forward = forward  # an instance attribute, as accelerate sets it
    for name in _hook_calling_methods(module):
        module.__dict__[name] = _through_engine(hook, getattr(module, name))
        hook.wrapped_methods.append(name)
    module.__dict__["state_dict"] = _reading_host_weights(hook, module.state_dict)
    hook.wrapped_methods.append("state_dict")
    module.__dict__["to"] = guarded_to(hook, module)  # no device move by hand; dtypes through the engine
    hook.wrapped_methods.append("to")


def _reading_host_weights(hook: OffloadHook, bound: Callable[..., Any]) -> Callable[..., Any]:
    """``state_dict`` with the model's weights in memory (``OffloadEngine.host_weights``): a model whose host
    copy is on disk is read back first, so the state dict (what ``save_pretrained`` of diffusers, transformers
    and peft writes) holds its values, never placeholders. The tensors it returns keep them after the model
    is dropped again; ``keep_vars=True`` returns the Parameter objects themselves, which do not. Nothing is
    dropped at its end (a loader may call it in the middle of changing the model): at the next placement."""

    @functools.wraps(bound)
    def state_dict(*args, **kwargs):
        with hook.engine.host_weights(hook.model_id, drop_after=False):
            return bound(*args, **kwargs)

    return state_dict


def _through_engine(hook: OffloadHook, bound: Callable[..., Any]) -> Callable[..., Any]:
    """``bound`` (a method that calls the hook's pre_forward itself) run as one call of the hooked model."""

    @functools.wraps(bound)
    def method(*args, **kwargs):
        # The hook's pre_forward gets no inputs this way: send them here, as they may come from another device.
        args, kwargs = (
            send_to_device(args, hook.execution_device),
            send_to_device(kwargs, hook.execution_device),
        )
        return hook.engine.run_forward(hook.model_id, bound, args, kwargs)

    return method


def remove_hook(module: torch.nn.Module) -> None:
    """Remove the offload hook from ``module`` and restore its own forward and methods."""
    hook = getattr(module, "_hf_hook", None)
    if isinstance(hook, OffloadHook):
        for name in hook.wrapped_methods:
            module.__dict__.pop(name, None)
        if hook.original_forward is not None:
            module._old_forward = hook.original_forward  # type: ignore[assignment]  # a plain attribute
    remove_hook_from_module(module)
