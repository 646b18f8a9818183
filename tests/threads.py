"""Checks that a fixture's threads ended with it."""

from __future__ import annotations

import threading
import time


def threads_left(before: set[threading.Thread], timeout: float = 10.0) -> list[str]:
    """Names of the threads started since ``before`` that are still running after waiting up to ``timeout`` s.

    A stopped thread may need a moment to return (AnyIO's worker threads are told to stop when the server's
    event loop ends and exit on their own a little later), so a fixture waits for its threads rather than
    looking once; a thread that never ends still shows.
    """
    deadline = time.monotonic() + timeout
    while left := [thread for thread in set(threading.enumerate()) - before if thread.is_alive()]:
        if time.monotonic() >= deadline:
            return sorted(thread.name for thread in left)
        left[0].join(timeout=0.05)
    return []
