"""Server-sent events of one job or of the whole queue: ``id``, ``event`` (the kind) and ``data`` (the JSON).

A job's stream starts with what the job said so far and ends after its final event (``done``, ``failed``,
``cancelled``); the queue's runs until the client leaves. A comment line every ``KEEPALIVE`` seconds keeps
proxies from closing an idle stream and finds clients that left; a listener is dropped when its client
goes, so streams that drop cost nothing after. Every stream ends when the server stops (``closing`` is set
by ``RunningServer.stop``): a page left open must not hold the shutdown until uvicorn cancels it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from modular.http.service import JobService
from modular.serving.events import FINAL_KINDS

__all__ = ["KEEPALIVE", "event_stream", "sse"]

KEEPALIVE = 10.0
POLL = 0.05  # seconds between looks at the listener: no thread per stream


def sse(event: dict[str, Any]) -> str:
    return f"id: {event['seq']}\nevent: {event['kind']}\ndata: {json.dumps(event)}\n\n"


def event_stream(
    jobs: JobService, request: Request, job_id: str | None, closing: threading.Event | None = None
) -> StreamingResponse:
    listener = jobs.events.subscribe(job_id)
    finished = job_id is not None and jobs.describe(job_id)["state"] in FINAL_KINDS

    async def lines() -> AsyncIterator[str]:
        quiet_since = time.monotonic()
        try:
            yield ": stream open\n\n"
            while True:
                event = listener.get(timeout=0)
                if event is None:
                    if closing is not None and closing.is_set():
                        return  # the server is stopping: what was said is sent, then the stream ends
                    if finished and job_id is not None:
                        return  # a finished job's history is all there is
                    if await request.is_disconnected():
                        return
                    if time.monotonic() - quiet_since > KEEPALIVE:
                        quiet_since = time.monotonic()
                        yield ": keepalive\n\n"
                    await asyncio.sleep(POLL)
                    continue
                quiet_since = time.monotonic()
                yield sse(event)
                if job_id is not None and event["kind"] in FINAL_KINDS:
                    return
        finally:
            listener.close()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(lines(), media_type="text/event-stream", headers=headers)
