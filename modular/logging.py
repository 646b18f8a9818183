"""One switch for what the project says, as diffusers and transformers each have one for themselves.

The project logs under four roots (``offload``, ``components``, ``modular``, ``blocks``); its pipelines
drive diffusers, transformers and huggingface_hub, which log and show progress bars of their own. These
functions set all of them at once: ``set_verbosity_error()`` leaves errors only, ``disable_progress_bar()``
hides the denoising loops' bars and the libraries' loading and download bars. A pipeline's own
``set_progress_bar_config(disable=...)`` still decides for that pipeline's loops.

By default the libraries' loading and writing bars ("Loading weights", "Loading checkpoint shards", "Writing
model shards") are left out of this project's own loads and saves (``components/library_bars.py``):
``enable_progress_bar()`` lets them through.

The libraries are imported only when a switch is used, so ``import modular`` stays cheap.
"""

from __future__ import annotations

import logging as _logging

from components.library_bars import show_library_bars

__all__ = [
    "ROOTS",
    "disable_progress_bar",
    "enable_progress_bar",
    "get_verbosity",
    "is_progress_bar_enabled",
    "set_verbosity",
    "set_verbosity_debug",
    "set_verbosity_error",
    "set_verbosity_info",
    "set_verbosity_warning",
]

ROOTS = ("offload", "components", "modular", "blocks")
"""The project's logger roots: every module logs under ``logging.getLogger(__name__)`` below one of them."""

_bars = {"enabled": True}


def set_verbosity(level: int) -> None:
    """Set the level of the project's loggers and of diffusers', transformers' and huggingface_hub's."""
    for root in ROOTS:
        _logging.getLogger(root).setLevel(level)
    import diffusers.utils.logging
    import huggingface_hub.utils.logging
    import transformers.utils.logging

    diffusers.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    huggingface_hub.utils.logging.set_verbosity(level)


def get_verbosity() -> int:
    """The effective level of the project's loggers (``logging.WARNING`` unless set)."""
    return _logging.getLogger(ROOTS[2]).getEffectiveLevel()


def set_verbosity_debug() -> None:
    set_verbosity(_logging.DEBUG)


def set_verbosity_info() -> None:
    set_verbosity(_logging.INFO)


def set_verbosity_warning() -> None:
    set_verbosity(_logging.WARNING)


def set_verbosity_error() -> None:
    set_verbosity(_logging.ERROR)


def disable_progress_bar() -> None:
    """Hide every progress bar: the denoising loops' (unless a pipeline's config says otherwise) and the
    libraries' loading, saving and download bars."""
    _set_bars(False)
    show_library_bars(False)


def enable_progress_bar(loading: bool = True) -> None:
    """Show the progress bars: the denoising loops', the libraries' download bars, and (unless
    ``loading=False``, the default before any switch is used) the libraries' loading and writing bars during
    this project's loads and saves."""
    _set_bars(True)
    show_library_bars(loading)


def is_progress_bar_enabled() -> bool:
    """Whether the denoising loops show a bar when their pipeline's config does not say."""
    return _bars["enabled"]


def _set_bars(enabled: bool) -> None:
    _bars["enabled"] = enabled
    import diffusers.utils.logging
    import huggingface_hub.utils
    import transformers.utils.logging

    if enabled:
        diffusers.utils.logging.enable_progress_bar()
        transformers.utils.logging.enable_progress_bar()
        huggingface_hub.utils.enable_progress_bars()
    else:
        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
