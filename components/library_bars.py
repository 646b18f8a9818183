"""The libraries' loading and writing bars during this project's own loads and saves: hidden unless asked for.

transformers draws "Loading weights" on every model it loads (and "Writing model shards" on every save),
diffusers "Loading checkpoint shards" on a sharded checkpoint. A pipeline loads several models per call of
``load_components``, so those bars would open every program's output. ``library_bars_hidden()`` wraps
this project's loads (``ComponentSpec.load``) and saves; ``show_library_bars(True)`` (what
``modular.logging.enable_progress_bar()`` calls) lets them through.

The scope is the wrapped call, not the process. transformers takes a tqdm hook (``set_tqdm_hook``): ours
is installed while a wrapped call runs, chains to any hook set before, and hides only the bars made by the
thread inside the call, so the user's own loads elsewhere keep their bars. diffusers 0.42 has no hook or
per-call option, only its module-wide switch: it is turned off for the duration of the wrapped calls and
restored after (its switch governs only its loading bars, so nothing else of the user's is touched).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["library_bars_hidden", "library_bars_shown", "show_library_bars"]

_state = {"shown": False}
_lock = threading.Lock()
_local = threading.local()  # .depth: how deeply this thread is inside wrapped calls
# While any thread is inside: how many are, transformers' hook set before ours, and diffusers' switch before.
_active: dict[str, Any] = {"threads": 0, "previous_hook": None, "diffusers_was_on": False}


def show_library_bars(shown: bool) -> None:
    """Let the libraries' loading and writing bars through this project's loads and saves (``True``), or hide
    them there (``False``, the default)."""
    _state["shown"] = bool(shown)


def library_bars_shown() -> bool:
    """Whether this project's loads and saves show the libraries' loading and writing bars."""
    return _state["shown"]


@contextmanager
def library_bars_hidden() -> Iterator[None]:
    """Inside, the bars transformers and diffusers make for this thread's loads and saves are hidden, unless
    ``show_library_bars(True)`` was called. Nests."""
    depth = getattr(_local, "depth", 0)
    if depth or _state["shown"]:
        yield
        return
    _enter()
    _local.depth = 1
    try:
        yield
    finally:
        _local.depth = 0
        _leave()


def _enter() -> None:
    import diffusers.utils.logging
    import transformers.utils.logging

    with _lock:
        if _active["threads"] == 0:
            _active["previous_hook"] = transformers.utils.logging.set_tqdm_hook(_hiding_hook)
            _active["diffusers_was_on"] = diffusers.utils.logging.is_progress_bar_enabled()
            diffusers.utils.logging.disable_progress_bar()
        _active["threads"] += 1


def _leave() -> None:
    import diffusers.utils.logging
    import transformers.utils.logging

    with _lock:
        _active["threads"] -= 1
        if _active["threads"] == 0:
            transformers.utils.logging.set_tqdm_hook(_active["previous_hook"])
            _active["previous_hook"] = None
            if _active["diffusers_was_on"]:
                diffusers.utils.logging.enable_progress_bar()


def _hiding_hook(factory: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """transformers' tqdm hook while a wrapped call runs: this thread's bars inside it made disabled, then the
    hook set before ours (if any) asked as usual."""
    if getattr(_local, "depth", 0):
        kwargs = {**kwargs, "disable": True}
    previous = _active["previous_hook"]
    return factory(*args, **kwargs) if previous is None else previous(factory, args, kwargs)
