"""Pipeline calls running on models, and changes of those models that wait for them.

A model shared by several pipelines (one manager, or one object handed to two pipelines) can be changed by one
while another's call runs on it: a LoRA fused between two denoising steps, an IP-Adapter's processors taken out
under a running step. Whether auto offload is on or not, a pipeline call counts as running on its models from
its start to its end (``running``), and every change of a model's weights or processors (``changing``) waits
until no call of it runs in another thread, while new calls of it wait for the change to end. So a call sees a
model all before or all after a change, never part of each.

One tracker per process (``MODEL_CALLS``), keyed by the model objects, so that pipelines on different managers,
or on none, that share a model wait for each other too. The waits are bounded by ``timeout`` seconds (the
manager's ``wait_timeout``), then ``offload.OffloadTimeoutError``, as ``cm.remove`` and
``disable_auto_cpu_offload`` wait for offload's running calls.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from offload.engine.calls import wait_while_busy
from offload.errors import OffloadTimeoutError

__all__ = ["DEFAULT_WAIT_TIMEOUT", "MODEL_CALLS", "ModelCalls"]

#: Seconds a change waits for running calls (and a call for a change), as offload's ``wait_timeout`` default.
DEFAULT_WAIT_TIMEOUT = 600.0


class ModelCalls:
    """Which models pipeline calls run on (per thread), and which are being changed (by which thread).

    Thread safe. A model is keyed by ``id()`` while a call or a change holds it; the entry goes when the last
    one ends, so an id reused by a later object starts clean.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running: Counter[int] = Counter()  # model -> calls in progress, all threads
        self._by_thread: dict[int, Counter[int]] = {}  # thread -> its calls in progress, by model
        self._pending: Counter[int] = Counter()  # model -> changes waiting or in progress: new calls wait
        self._changer: dict[int, tuple[int, int]] = {}  # model -> (thread changing it, nesting depth)

    @contextmanager
    def running(self, models: Iterable[Any], what: str, timeout: float) -> Iterator[None]:
        """While inside, a call (``what``, e.g. the pipeline's class) runs on ``models``: changes of them wait.

        A call first waits for changes of its models in progress in other threads (at most ``timeout``
        seconds). A call nested in one of this thread's calls or changes goes on at once.

        Raises:
            offload.OffloadTimeoutError: a change of one of the models did not end within ``timeout``.
        """
        keys = _keys(models)
        me = threading.get_ident()
        with self._changed:
            if busy := wait_while_busy(
                self._changed, lambda: [k for k in keys if self._blocks_call(k, me)], timeout
            ):
                msg = (
                    f"{what} waited {timeout:g} s for a change of {len(busy)} of its models (LoRA, "
                    "IP-Adapter, removal) in another thread to end, and did not start. Let the change "
                    "finish first, or raise wait_timeout (components_manager.wait_timeout = ...)."
                )
                raise OffloadTimeoutError(msg)
            self._running.update(keys)
            self._by_thread.setdefault(me, Counter()).update(keys)
        try:
            yield
        finally:
            with self._changed:
                self._running.subtract(keys)
                self._running = +self._running
                mine = self._by_thread[me]
                mine.subtract(keys)
                if not +mine:
                    del self._by_thread[me]
                else:
                    self._by_thread[me] = +mine
                self._changed.notify_all()

    @contextmanager
    def changing(self, models: Iterable[Any], what: str, timeout: float) -> Iterator[None]:
        """While inside, ``what`` (e.g. ``"fuse_lora()"``) changes ``models``: it has them to itself.

        It first waits until no call of them runs in another thread and no other thread changes them (at most
        ``timeout`` seconds); new calls of them wait from the moment it asks. A change nested in one of this
        thread's changes of the same models goes on at once.

        Raises:
            RuntimeError: this thread is inside a call of one of the models (its change would pull the model
                from under that call).
            offload.OffloadTimeoutError: calls were still running after ``timeout`` seconds; nothing changed.
        """
        keys = _keys(models)
        me = threading.get_ident()
        with self._changed:
            mine = self._by_thread.get(me, Counter())
            if any(mine[k] for k in keys):
                msg = (
                    f"{what} was called from inside a pipeline call running on the same model in this thread; "
                    "changing the model mid-call would change it under that call. Call it after the call returns."
                )
                raise RuntimeError(msg)
            self._pending.update(keys)
            try:

                def held() -> list[int]:
                    return [k for k in keys if self._running[k] or self._changer.get(k, (me, 0))[0] != me]

                if busy := wait_while_busy(self._changed, held, timeout):
                    msg = (
                        f"{what} waited {timeout:g} s for the running calls of {len(busy)} of its models in "
                        "other threads to finish; nothing was changed. Let those calls finish first, or "
                        "raise wait_timeout (components_manager.wait_timeout = ...)."
                    )
                    raise OffloadTimeoutError(msg)
            except BaseException:
                self._pending.subtract(keys)
                self._pending = +self._pending
                self._changed.notify_all()
                raise
            for k in keys:
                depth = self._changer.get(k, (me, 0))[1]
                self._changer[k] = (me, depth + 1)
        try:
            yield
        finally:
            with self._changed:
                for k in keys:
                    thread, depth = self._changer[k]
                    if depth > 1:
                        self._changer[k] = (thread, depth - 1)
                    else:
                        del self._changer[k]
                self._pending.subtract(keys)
                self._pending = +self._pending
                self._changed.notify_all()

    def running_count(self, model: Any) -> int:
        """How many calls run on ``model`` now, in all threads."""
        with self._changed:
            return self._running[id(model)]

    def _blocks_call(self, key: int, me: int) -> bool:
        """Whether a change keeps a new call of this thread from starting on the model ``key``."""
        changer = self._changer.get(key)
        if changer is not None:
            return changer[0] != me
        # A change only asked for waits for this thread's outer call, which must end first: a nested call
        # goes on (waiting for that change would wait for itself).
        return bool(self._pending[key]) and not self._by_thread.get(me)


def _keys(models: Iterable[Any]) -> list[int]:
    """One key per distinct model (a model named twice counts once)."""
    return list(dict.fromkeys(id(model) for model in models if model is not None))


#: The process's tracker: every pipeline call and every model change goes through it.
MODEL_CALLS = ModelCalls()
