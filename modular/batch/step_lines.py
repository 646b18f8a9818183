"""Progress as a line now and then, for a stderr that is not a terminal (CI logs, ``2>log``).

A tqdm bar redraws one line with carriage returns, which a log file keeps as one endless line, so tqdm
turns itself off there and a run says nothing for minutes. ``StepLines`` takes a bar's place (the part of
tqdm's interface the loops and the job runner use) and writes whole lines instead:
``job 1/3 tiny-flux-dev: step 10/28``, one each time about a tenth of the total is done or ``interval``
seconds passed, and one at the end.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

__all__ = ["StepLines", "is_terminal"]

EVERY = 0.1
"""A line each time this share of the total is done."""
INTERVAL = 30.0
"""Seconds after which a line is written even if less than ``EVERY`` of the total was done (slow steps)."""


def is_terminal(stream: Any) -> bool:
    """True if ``stream`` is an interactive terminal (a bar redraws there; elsewhere lines are written)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False


class StepLines:
    """A tqdm stand-in writing ``"{desc} {n}/{total}"`` lines (and ``" (postfix)"`` when one is set).

    Args:
        iterable: Iterated over, counting one per item (as ``tqdm(iterable)``).
        total: The count at the end (``len(iterable)`` when not given and it has one).
        desc: What the count is of, e.g. ``"job 1/3 tiny-flux-dev: step"``.
        disable: Write nothing (as tqdm's ``disable=True``).
        file: Where lines go (default: ``sys.stderr`` as it is when a line is written).
        every: A line each time this share of ``total`` is done.
        interval: A line after this many seconds without one, however little was done.
        clock: Seconds, monotonic (tests give their own).
        **_: Other tqdm options (``unit``, ``leave``...), which do not apply to lines.
    """

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        total: int | None = None,
        desc: str = "",
        disable: bool | None = False,
        file: IO[str] | None = None,
        every: float = EVERY,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        **_: Any,
    ) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]  # checked just above
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.disable = bool(disable)
        self.n = 0
        self._file = file
        self._every = max(1, math.ceil(total * every)) if total else 1
        self._interval = interval
        self._clock = clock
        self._postfix = ""
        self._written_n = 0
        self._written_at = clock()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            msg = "StepLines: nothing to iterate over (it was made with a total only); call update() instead"
            raise TypeError(msg)
        for item in self.iterable:
            yield item
            self.update()

    def __enter__(self) -> StepLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more done; write a line if a tenth more is done, ``interval`` passed, or it is the end."""
        self.n += n
        now = self._clock()
        due = (
            self.n == self.total
            or self.n - self._written_n >= self._every
            or now - self._written_at >= self._interval
        )
        if due and not self.disable:
            self._write(now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Name what the last count was of (the component just loaded), shown in brackets."""
        self._postfix = s

    def close(self) -> None:
        """Nothing to clear: the lines written stay."""

    def _write(self, now: float) -> None:
        count = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        line = f"{self.desc} {count}" + (f" ({self._postfix})" if self._postfix else "")
        file = self._file if self._file is not None else sys.stderr
        file.write(line + "\n")
        file.flush()
        self._written_n, self._written_at = self.n, now
