"""The execution plan: which models the running pipeline will use next.

The pipeline gives the order in which its blocks use models, with each loop body listed once
(``[text_encoder, unet, vae]`` for a 50-step run). The plan follows the actual uses with a cursor
(a use of the first model after the last one starts the list again: the same pipeline usually runs
again) and learns loops from what it sees: a use that jumps back to an earlier position (not the
start) marks ``[that position, cursor]`` as a loop body, so while inside it the loop's members come
before anything after the loop.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ExecutionPlan"]


class ExecutionPlan:
    """Upcoming model uses of one pipeline call.

    Args:
        model_ids: Model ids in order of use, loop bodies once. Empty means "unknown future".
    """

    def __init__(self, model_ids: Sequence[str] = ()):
        self.model_ids: tuple[str, ...] = tuple(model_ids)
        self.cursor = -1  # position of the last use; -1 before the first
        self.loops: set[tuple[int, int]] = set()
        self._positions: dict[str, list[int]] = {}
        for index, model_id in enumerate(self.model_ids):
            self._positions.setdefault(model_id, []).append(index)

    def __bool__(self) -> bool:
        return bool(self.model_ids)

    def locate(self, model_id: str) -> int | None:
        """Position of ``model_id``'s next occurrence after the cursor (cyclically), or None if absent."""
        positions = self._positions.get(model_id)
        if not positions:
            return None
        n = len(self.model_ids)
        return min(positions, key=lambda index: (index - self.cursor - 1) % n)

    def observe(self, model_id: str) -> None:
        """Record a use of ``model_id``: move the cursor to it and learn a loop on a backward jump."""
        index = self.locate(model_id)
        if index is None:
            return
        if 0 < index <= self.cursor:
            self.loops.add((index, self.cursor))
        self.cursor = index

    def _loop_around(self, index: int) -> tuple[int, int] | None:
        spans = [loop for loop in self.loops if loop[0] <= index <= loop[1]]
        return max(spans, key=lambda loop: loop[1] - loop[0]) if spans else None

    def upcoming(self, model_id: str) -> tuple[str, ...]:
        """The predicted uses of this run after a use of ``model_id`` now, nearest first.

        Inside a learned loop, the rest of this iteration and one more iteration come first.
        """
        ids = self.model_ids
        index = self.locate(model_id)
        if index is None:
            return ids[self.cursor + 1 :]
        loop = self._loop_around(index)
        if loop is None:
            return ids[index + 1 :]
        first, last = loop
        return ids[index + 1 : last + 1] + ids[first : last + 1] + ids[last + 1 :]
