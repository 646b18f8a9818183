"""Running the app under uvicorn: in the foreground (``modular serve``) or in a thread (tests, notebooks)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import attrs
import uvicorn

from modular.http.settings import ServerSettings

__all__ = ["RunningServer", "bind_socket", "start_server"]


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


def bind_socket(settings: ServerSettings) -> socket.socket:
    """The listening socket of ``settings``' address, bound here rather than by uvicorn, so that a port in use
    is one clear error (uvicorn would log it, then exit its thread).

    Raises:
        OSError: the address cannot be bound (the port is taken, the host is not this machine's).
    """
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
    except OSError as error:
        sock.close()
        msg = (
            f"cannot listen on {settings.host}:{settings.port} ({error.strerror or error}); choose another "
            "--port, or 0 for a free one"
        )
        refused = OSError(msg)
        refused.errno = error.errno
        raise refused from None
    return sock


def start_server(app: Any, settings: ServerSettings, timeout: float = 20.0) -> RunningServer:
    """Start ``app`` in a daemon thread and wait until it listens (``settings.port`` 0: a free port).

    Raises:
        ValueError: settings a server must not start with (``ServerSettings.check``).
        OSError: the address cannot be bound (``bind_socket``).
        RuntimeError: it did not start within ``timeout`` seconds.
    """
    settings.check()
    sock = bind_socket(settings)
    server = uvicorn.Server(uvicorn_config(app, settings))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="modular-serve-http", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            msg = f"the server did not start on {settings.host}:{settings.port} within {timeout:g} s"
            raise RuntimeError(msg)
        time.sleep(0.02)
    port = sock.getsockname()[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return RunningServer(f"http://{host}:{port}", port, server, thread, app)
