"""What a watched call reports and obeys: a cancel token, progress events, previews."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import attrs

__all__ = ["Cancellable", "CancelToken", "Preview", "ProgressEvent"]


class Cancellable(Protocol):
    def is_set(self) -> bool: ...


class CancelToken:
    """A flag another thread sets to cancel a call: ``pipe(..., cancel=token)``, later ``token.cancel()``.

    A ``threading.Event`` works the same (``event.set()``); this adds :meth:`cancel` and a reason that
    :class:`CallCancelled` repeats.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None

    def cancel(self, reason: str | None = None) -> None:
        """Ask every call watching this token to stop before its next block or step."""
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def __repr__(self) -> str:
        return f"CancelToken(cancelled={self.cancelled})"


@attrs.frozen
class ProgressEvent:
    """One event of a call's progress, as ``on_progress`` receives it.

    Attributes:
        kind: ``"block_started"``, ``"block_finished"`` or ``"step"`` (a denoising step done).
        stage: the block's name in the pipeline (``"denoise"``; nested ones dotted, ``"denoise.loop"``).
        step: for ``"step"``, the steps of this loop done so far (1 to ``total``); ``None`` otherwise.
        total: for ``"step"``, the loop's number of steps; ``None`` otherwise.
        elapsed: seconds since the call started.
    """

    kind: str
    stage: str
    step: int | None
    total: int | None
    elapsed: float


@attrs.frozen
class Preview:
    """A look at the image being made, as ``on_preview`` receives it every ``preview_every`` steps.

    Attributes:
        images: one ``PIL.Image.Image`` (RGB) per image of the batch, made from the current latents without the
            VAE (or with the call's ``preview_decoder``).
        step: the steps of this loop done so far (1 to ``total``).
        total: the loop's number of steps.
        stage: the loop's name in the pipeline.
        elapsed: seconds since the call started.
    """

    images: list[Any]
    step: int
    total: int
    stage: str
    elapsed: float
