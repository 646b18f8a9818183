"""Job events, fanned out to every listener: the whole queue's stream and each job's own.

An event is a JSON table: ``kind`` (``queued``, ``position``, ``started``, ``block``, ``step``, ``preview``,
``done``, ``failed``, ``cancelled``, ``paused``, ``resumed``), ``job`` (its id, ``None`` for the queue's own),
``time`` (seconds since the epoch), ``seq`` (the hub's counter) and the kind's fields. Each listener has its
own bounded queue; a listener that falls behind loses its oldest events, never the newest (so the final
event of a job always arrives) and never slows the job. A job's listener first receives what the job said
so far (its step and preview events shortened to the latest), then what it says next. The hub keeps the
history of the latest ``keep_jobs`` jobs only, so memory stays bounded on a server that runs for weeks.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

__all__ = ["EventHub", "Listener"]

FINAL_KINDS = frozenset({"done", "failed", "cancelled"})
_LATEST_ONLY = frozenset({"step", "preview", "position", "block"})  # replayed as the latest of each kind


class Listener:
    """One subscriber's events; ``get`` waits for the next (``None`` on timeout). Close it when done (or use
    it as a context manager): a closed listener is dropped from the hub."""

    def __init__(self, hub: EventHub, job_id: str | None, size: int) -> None:
        self.hub = hub
        self.job_id = job_id
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(size)
        self.dropped = 0

    def put(self, event: dict[str, Any]) -> None:
        while True:
            try:
                self._queue.put_nowait(event)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def get(self, timeout: float | None = None) -> dict[str, Any] | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.hub.unsubscribe(self)

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EventHub:
    """Publishes events to listeners of one job and of the whole queue (see the module docstring).

    Args:
        listener_size: Events each listener may hold before its oldest is dropped.
        keep_jobs: Jobs whose history is kept for listeners that come later.

    Raises:
        ValueError: ``listener_size`` or ``keep_jobs`` is not a whole number of at least 1.
    """

    def __init__(self, listener_size: int = 256, keep_jobs: int = 1000) -> None:
        for name, value in (("listener_size", listener_size), ("keep_jobs", keep_jobs)):
            # queue.Queue(0) would hold events without bound: a listener that never reads would grow forever
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1 (got {value!r})")
        self._lock = threading.Lock()
        self._listeners: dict[str | None, list[Listener]] = collections.defaultdict(list)
        self._history: collections.OrderedDict[str, list[dict[str, Any]]] = collections.OrderedDict()
        self._size = listener_size
        self._keep = keep_jobs
        self._seq = 0

    def publish(self, kind: str, job_id: str | None = None, **fields: Any) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            event = {"kind": kind, "job": job_id, "time": time.time(), "seq": self._seq, **fields}
            if job_id is not None:
                history = self._history.setdefault(job_id, [])
                if kind in _LATEST_ONLY:
                    history[:] = [old for old in history if old["kind"] != kind]
                history.append(event)
                self._history.move_to_end(job_id)
                while len(self._history) > self._keep:
                    self._history.popitem(last=False)
            listeners = [*self._listeners.get(job_id, ()), *(self._listeners.get(None, ()) if job_id else ())]
            if job_id is None:
                listeners = list(self._listeners.get(None, ()))
            # Put under the lock (a put never blocks): each listener then gets events in ``seq`` order, even
            # when several threads publish at once (the worker, submitters, a cancel).
            for listener in listeners:
                listener.put(event)
        return event

    def subscribe(self, job_id: str | None = None) -> Listener:
        """A listener of ``job_id``'s events (its history first), or of every event when ``None``."""
        listener = Listener(self, job_id, self._size)
        with self._lock:
            if job_id is not None:
                for event in self._history.get(job_id, ()):
                    listener.put(event)
            self._listeners[job_id].append(listener)
        return listener

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            listeners = self._listeners.get(listener.job_id, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(listener.job_id, None)

    def history(self, job_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._history.get(job_id, ()))

    def listener_count(self) -> int:
        with self._lock:
            return sum(len(listeners) for listeners in self._listeners.values())
