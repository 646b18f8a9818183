"""Running the app under uvicorn: in the foreground (``modular serve``) or in a thread (tests, notebooks)."""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs
import uvicorn

from modular.http.settings import ServerSettings

__all__ = ["RunningServer", "start_server"]


@attrs.define
class RunningServer:
    """A server running in a thread; ``url`` is where it listens (``http://127.0.0.1:PORT``)."""

    url: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread
    app: Any = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, end the open event streams (``make_app``'s ``closing``), and wait for the thread."""
        closing = getattr(getattr(self.app, "state", None), "closing", None)
        if isinstance(closing, threading.Event):
            closing.set()
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def uvicorn_config(app: Any, settings: ServerSettings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
        limit_concurrency=256,
    )


def start_server(app: Any, settings: ServerSettings, timeout: float = 20.0) -> RunningServer:
    """Start ``app`` in a daemon thread and wait until it listens (``settings.port`` 0: a free port).

    Raises:
        ValueError: settings a server must not start with (``ServerSettings.check``).
        RuntimeError: it did not start within ``timeout`` seconds (the port is taken, say).
    """
    settings.check()
    server = uvicorn.Server(uvicorn_config(app, settings))
    thread = threading.Thread(target=server.run, name="modular-serve-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            msg = f"the server did not start on {settings.host}:{settings.port} (is the port taken?)"
            raise RuntimeError(msg)
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return RunningServer(f"http://{host}:{port}", port, server, thread, app)
