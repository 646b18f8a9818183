"""Who runs what: the models inside a hooked call, per thread, and the threads waiting for room.

The engine keeps one ``CallTracker`` on its lock's condition. A model inside a call is never evicted;
a call that needs room held by such models waits, and this record tells the engine when waiting cannot
help: the room is held by the waiting thread itself (a model whose forward calls another), or every
thread holding it waits for room too (a wait-for cycle). Taking models off (``detach``, ``close``)
waits here until their calls have returned, while new calls of them wait.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Collection, Sequence

import attrs

from offload.errors import OffloadTimeoutError
from offload.records import messages

__all__ = ["CallTracker", "Waiter", "check_wait_timeout", "wait_while_busy"]


def wait_while_busy(condition: threading.Condition, busy: Callable[[], list], timeout: float) -> list:
    """Wait on ``condition`` (held by the caller) until ``busy()`` is empty, at most ``timeout`` seconds; return
    what is still busy then (empty: free). ``threading.Condition.wait_for`` does the waiting."""
    condition.wait_for(lambda: not busy(), timeout)
    return busy()


def check_wait_timeout(value: object) -> float:
    """``value`` as seconds to wait for room, once known to be a positive, finite number.

    Raises:
        TypeError: not a number. ValueError: not positive and finite.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"wait_timeout must be a number of seconds (got {value!r} that is a {type(value)})."
        raise TypeError(msg)
    if not 0 < value < math.inf:
        msg = f"wait_timeout must be a positive, finite number of seconds (got {value!r}). Example: 600."
        raise ValueError(msg)
    return float(value)


@attrs.frozen
class Waiter:
    """A thread waiting for room: the model it wants placed, that model's size in bytes, the thread's name."""

    model_id: str
    nbytes: int
    thread_name: str


class CallTracker:
    """Models inside a hooked call (counted per thread), threads waiting for room, models being taken off.

    Args:
        changed: The engine's condition (on the engine's lock), notified when a call ends. Every method
            must be called with that lock held.
    """

    def __init__(self, changed: threading.Condition) -> None:
        self._changed = changed
        self.running: Counter[str] = Counter()  # model id -> calls in progress, all threads
        self._by_thread: dict[int, Counter[str]] = {}
        self._names: dict[int, str] = {}
        self.waiting: dict[int, Waiter] = {}
        self._closing: Counter[str] = Counter()  # models being taken off: new calls of them wait

    def enter(self, model_id: str, attached: Callable[[str], bool]) -> bool:
        """Count one call of ``model_id`` in the current thread; False (not counted) if it is not attached.

        While ``model_id`` is being taken off, a call waits until that is done. A call nested in one of this
        thread's calls goes on at once: the taking off waits for the outer call, so it must finish.
        """
        if not self.in_call():
            while self._closing[model_id]:
                self._changed.wait()
        if not attached(model_id):
            return False
        thread = threading.current_thread()
        self.running[model_id] += 1
        self._by_thread.setdefault(thread.ident or 0, Counter())[model_id] += 1
        self._names[thread.ident or 0] = thread.name
        return True

    def exit(self, model_id: str) -> None:
        """End one call of ``model_id`` in the current thread and wake the waiting threads."""
        me = threading.get_ident()
        self.running[model_id] -= 1
        if not self.running[model_id]:
            del self.running[model_id]
        mine = self._by_thread[me]
        mine[model_id] -= 1
        if not mine[model_id]:
            del mine[model_id]
        if not mine:
            del self._by_thread[me]
            del self._names[me]
        self._changed.notify_all()

    def await_no_calls(self, model_ids: Sequence[str], what: str, timeout: float) -> None:
        """Wait until no thread is inside a call of ``model_ids``; new calls of them wait meanwhile.

        Raises:
            RuntimeError: the current thread is inside a call of one of them.
            OffloadTimeoutError: calls were still in progress after ``timeout`` seconds.
        """
        inside = [m for m in model_ids if self.in_call()[m]]
        if inside:
            msg = (
                f"{what} was called from inside a call of {inside!r} in this thread; taking a model off mid-call "
                "would pull its weights away under it. Call it after the call returns."
            )
            raise RuntimeError(msg)
        self._closing.update(model_ids)
        try:
            if busy := wait_while_busy(
                self._changed, lambda: [m for m in model_ids if self.running[m]], timeout
            ):
                raise OffloadTimeoutError(messages.busy_timeout(what, timeout, busy))
        finally:
            self._closing.subtract(model_ids)
            self._closing = +self._closing  # drop the zeros
            self._changed.notify_all()

    def in_call(self, thread: int | None = None) -> Counter[str]:
        """The calls in progress in ``thread`` (the current one by default), by model id."""
        return self._by_thread.get(threading.get_ident() if thread is None else thread, Counter())

    def name(self, thread: int) -> str:
        """The name of a thread that is in a call or waiting."""
        waiter = self.waiting.get(thread)
        return waiter.thread_name if waiter is not None else self._names.get(thread, str(thread))

    def holders(self, model_ids: Collection[str]) -> dict[int, list[str]]:
        """Threads with a call of any of ``model_ids`` in progress, and which of them."""
        held = {}
        for thread, calls in self._by_thread.items():
            models = [m for m in model_ids if calls[m]]
            if models:
                held[thread] = models
        return held

    def wait_for_cycle(self, held: Collection[str], room: int) -> bool:
        """True if waiting cannot help the current thread: it holds some of ``held`` (running, resident
        models), every other thread holding some waits for room too, and none of those waits could be
        met with ``room`` bytes (free plus evictable) now."""
        me = threading.get_ident()
        holders = self.holders(held)
        others = [t for t in holders if t != me]
        if me not in holders or not others or any(t not in self.waiting for t in others):
            return False
        return not any(w.nbytes <= room for t, w in self.waiting.items() if t != me)
