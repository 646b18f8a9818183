"""Strategies written for diffusers' ``ComponentsManager`` (the peer), run by our engine.

The peer calls a strategy as ``strategy(hooks=..., model_id=..., model=..., execution_device=...)``: ``hooks``
holds one hook per other model on the device (each with ``model_id`` and ``model``), ``model`` is the one about
to run, and the strategy returns the hooks to offload. :class:`PeerStrategy` puts such a callable behind our
protocol (``select_victims(request)``), so ``cm.enable_auto_cpu_offload(offload_strategy=...)`` and
``cm.set_offload_strategy(...)`` take either kind. Our engine still checks the answer (known residents that
free enough) and logs each eviction with the strategy's name, as for ours.

Two differences from the peer, both because our engine decides from its own byte accounting: the strategy
is asked only when the model does not fit (the peer asks before every move), and ``hooks`` leaves out models
inside a forward, which cannot be evicted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from offload.errors import StrategyError
from offload.strategies.strategy import OffloadRequest, OffloadStrategy, SupportsSelectVictims, check_strategy

__all__ = ["PeerHook", "PeerStrategy", "as_strategy", "is_peer_strategy"]

_PEER_ARGUMENTS = ("hooks", "model_id", "model", "execution_device")


@attrs.frozen(eq=False)
class PeerHook:
    """What a peer strategy sees of one resident model: its id and the module (as the peer's hooks)."""

    model_id: str
    model: torch.nn.Module

    def offload(self) -> None:
        """Refused: a strategy names the models to offload by returning their hooks; the engine moves them."""
        msg = f"hook {self.model_id!r}: return the hooks to offload from the strategy; the engine moves them"
        raise TypeError(msg)


def is_peer_strategy(strategy: object) -> bool:
    """Whether ``strategy`` is a callable that takes the peer's keywords (and not one of our strategies)."""
    if callable(getattr(strategy, "select_victims", None)) or not callable(strategy):
        return False
    try:
        inspect.signature(strategy).bind(**dict.fromkeys(_PEER_ARGUMENTS))
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): take it at its word
        return True
    return True


class PeerStrategy(OffloadStrategy):
    """A peer strategy behind our protocol.

    Args:
        strategy: ``(hooks, model_id, model, execution_device) -> hooks to offload``.
        module_of: The module attached under a model id (the engine's).
        execution_device: Where models run (handed to the strategy as the peer does).
    """

    def __init__(
        self,
        strategy: Callable[..., Any],
        module_of: Callable[[str], torch.nn.Module],
        execution_device: torch.device,
    ) -> None:
        self.strategy = strategy
        self._module_of = module_of
        self._execution_device = execution_device

    @property
    def name(self) -> str:
        """``peer:<the strategy's class or function name>``, as the offload log shows it."""
        inner = getattr(self.strategy, "__name__", None) or type(self.strategy).__name__
        return f"peer:{inner}"

    def __repr__(self) -> str:
        return f"PeerStrategy({self.strategy!r})"

    def select_victims(self, request: OffloadRequest) -> list[str]:
        """Ask the peer strategy which of ``request.residents`` to offload; return their ids.

        Raises:
            StrategyError: it returned something other than hooks it was given (nothing moved).
        """
        hooks = [PeerHook(model_id, self._module_of(model_id)) for model_id in request.residents]
        chosen = self.strategy(
            hooks=hooks,
            model_id=request.model_id,
            model=self._module_of(request.model_id),
            execution_device=self._execution_device,
        )
        given = {id(hook): hook.model_id for hook in hooks}
        picked = list(chosen) if isinstance(chosen, Sequence) and not isinstance(chosen, str) else None
        if picked is None or any(id(hook) not in given for hook in picked):
            msg = (
                f"strategy {self.name} returned {chosen!r} for {request.model_id!r}; a peer strategy returns a "
                f"list of the hooks it was given (models {list(request.residents)})"
            )
            raise StrategyError(msg)
        return [given[id(hook)] for hook in picked]


def as_strategy(
    strategy: object, module_of: Callable[[str], torch.nn.Module], execution_device: torch.device
) -> SupportsSelectVictims:
    """``strategy`` as the engine runs it: ours as it is, a peer strategy wrapped in :class:`PeerStrategy`.

    Raises:
        TypeError: it is neither (the message names both protocols).
    """
    if is_peer_strategy(strategy):
        return PeerStrategy(strategy, module_of, execution_device)  # type: ignore[arg-type]  # checked callable
    return check_strategy(strategy)
