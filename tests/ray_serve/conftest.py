"""Fixtures of the Ray Serve tests: the serving tests' tiny repos, workflows and direct calls, and a wait
for a replica's job to finish."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.serving.conftest import SMALL, WAIT, direct, serving_repos, sizes, workflows

__all__ = ["SMALL", "WAIT", "direct", "finished", "serving_repos", "sizes", "workflows"]

FINISHED = ("done", "failed", "cancelled")


def finished(describe: Callable[[str], dict[str, Any]], job_id: str, timeout: float = WAIT) -> dict[str, Any]:
    """Ask ``describe(job_id)`` until the job has finished (at most ``timeout`` seconds); its last description."""
    deadline = time.monotonic() + timeout
    while True:
        described = describe(job_id)
        if described["state"] in FINISHED or time.monotonic() > deadline:
            return described
        time.sleep(0.05)
