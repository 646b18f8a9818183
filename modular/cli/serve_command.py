"""``modular serve REPO_OR_WORKFLOW...``: the queue of ``modular.serving`` over HTTP, in the foreground.

Builds one ComponentsManager (auto offload as asked), the served workflows (pipelines bound: index files
read, no weights), the scheduler over the state folder (jobs an earlier run accepted and did not finish
queue again) and the app, prints one line with the URL, and serves until SIGINT or SIGTERM. Stopping ends
the HTTP server first (no job is accepted after), then the scheduler: the running job is requeued for the
next start (the images it finished are kept) and the waiting ones stay in the store. See docs/serving.md.

The argument checks (``check_serve_arguments``) import neither torch nor FastAPI's app, so a refused
command answers at once; FastAPI and uvicorn are the optional extra ``serve``. ``modular serve --ray``
(``modular/cli/serve_ray.py``) shares the checks, the queue's options, the start line and the stop on signals.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from modular.cli.args import SERVE_STATE

__all__ = [
    "RAY_EXTRA",
    "SERVE_EXTRA",
    "check_serve_arguments",
    "queue_options",
    "require_extra",
    "serve_command",
    "served_workflows",
    "server_settings",
    "start_line",
    "stop_on_signals",
    "wait_for_stop",
]

SERVE_EXTRA = 'pip install "modular-pipelines[serve]"'
RAY_EXTRA = 'pip install "modular-pipelines[ray]"'
# What the extra installs, by import name; python-multipart is imported as python_multipart (older: multipart).
_EXTRA_MODULES = (("fastapi",), ("uvicorn",), ("python_multipart", "multipart"))
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NEEDS_OFFLOAD = (("budget", "--budget"), ("margin", "--margin"), ("host_budget", "--host-budget"))


def require_extra() -> None:
    """Raises ImportError naming the missing package and the extra that installs it."""
    for names in _EXTRA_MODULES:
        missing = None
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError:
                missing = missing or name
            else:
                missing = None
                break
        if missing is not None:
            shown = "python-multipart" if missing in ("python_multipart", "multipart") else missing
            msg = f"modular serve needs {shown}, which is not installed: {SERVE_EXTRA}"
            raise ImportError(msg, name=missing)


def server_settings(args: argparse.Namespace) -> Any:
    """The ``ServerSettings`` of the command's options (those not given keep the class's defaults)."""
    from modular.http.settings import ServerSettings

    given = {"max_body": args.max_body, "max_upload": args.max_upload}
    limits = {key: value for key, value in given.items() if value is not None}
    return ServerSettings(host=args.host, port=args.port, token=args.token, **limits)


def check_serve_arguments(args: argparse.Namespace) -> None:
    """Refuse what ``modular serve`` must not start with, before torch or a model is imported.

    Raises:
        ImportError: FastAPI, uvicorn or python-multipart is missing (the message says how to install them).
        ValueError: another address than loopback without a token, a short token, budgets with
            ``--offload none``, ``--offload sim`` without ``--budget``, or a served workflow that is not
            ``REPO``, ``REPO:WORKFLOW`` or ``NAME=REPO[:WORKFLOW]``.
    """
    require_extra()
    server_settings(args).check()
    if args.offload == "none":
        for key, option in _NEEDS_OFFLOAD:
            if getattr(args, key) is not None:
                msg = f"{option} needs auto offload, which --offload none turns off; drop one of them"
                raise ValueError(msg)
    if args.offload == "sim" and args.budget is None:
        raise ValueError("--offload sim needs --budget: the simulated device's size, e.g. --budget 8GB")
    served_workflows(args)  # imports torch; the checks above answer before it


def served_workflows(args: argparse.Namespace) -> list[Any]:
    """The ``ServedWorkflow`` of each REPO_OR_WORKFLOW, in ``--dtype``.

    Raises:
        ValueError: one that is not ``REPO``, ``REPO:WORKFLOW`` or ``NAME=REPO[:WORKFLOW]``.
    """
    from modular.serving.served import parse_served

    return [parse_served(text, args.dtype) for text in args.served]


def queue_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Scheduler`` options of the queue and limits options given (``fairness``, ``limits``,
    ``max_queue``, ``preview_every``); those not given keep the classes' defaults."""
    from modular.serving.policy import Fairness
    from modular.serving.requests import Limits

    fairness = {"max_wait": args.max_wait, "max_bypass": args.max_bypass}
    limits = {"max_steps": args.max_steps, "max_images": args.max_images, "max_pixels": args.max_pixels}
    options: dict[str, Any] = {
        "fairness": Fairness(**{key: value for key, value in fairness.items() if value is not None}),
        "limits": Limits(**{key: value for key, value in limits.items() if value is not None}),
    }
    if args.max_queue is not None:
        options["max_queue"] = args.max_queue
    if args.preview_every is not None:
        options["preview_every"] = args.preview_every or None  # 0: no previews
    return options


def _offload_kind(args: argparse.Namespace, cuda: bool) -> str:
    """``--offload``, or when not given: auto with CUDA, else sim when there is a budget, else none."""
    if args.offload is not None:
        return str(args.offload)
    return "auto" if cuda else ("sim" if args.budget is not None else "none")


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` while inside (in the main thread only, where signals arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    earlier = {number: signal.getsignal(number) for number in _STOP_SIGNALS}
    for number in _STOP_SIGNALS:
        signal.signal(number, lambda *_: stop.set())
    try:
        yield
    finally:
        for number, handler in earlier.items():
            signal.signal(number, handler)


def wait_for_stop(stop: threading.Event, running: Callable[[], bool]) -> None:
    """Return once ``stop`` is set or ``running()`` is false (the server stopped on its own)."""
    while not stop.wait(0.25):
        if not running():
            return


def start_line(url: str, names: list[str], where: str, token: str | None) -> str:
    """The line said on start: where it listens, what it serves, where the models are, where the page is."""
    page = f"{url}/?token=<your token>" if token else f"{url}/"
    return f"modular serve: listening on {url} ({', '.join(names)}; models on {where}); the page: {page}"


def serve_command(
    args: argparse.Namespace,
    out: Callable[[str], Any] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve until SIGINT, SIGTERM or ``stop`` is set; returns the exit status (0). ``out`` takes the lines
    said on start and stop (default: printed at once, for whoever reads the URL from a pipe).

    Raises:
        ValueError, ImportError: the refusals of ``check_serve_arguments``; an offload the machine lacks.
        FileNotFoundError, JobFileError and the input errors of ``JobRunner.bind``: a repo that cannot be read.
        OSError: the address cannot be bound (a port in use, say). RuntimeError: the server did not start.
    """
    check_serve_arguments(args)
    out = out or functools.partial(print, flush=True)
    import torch

    from components import ComponentsManager
    from modular.batch.runner import enable_offload
    from modular.http.app import make_app
    from modular.http.server import start_server
    from modular.serving.scheduler import Scheduler
    from modular.serving.served import ServedWorkflows

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = server_settings(args)
    manager = ComponentsManager()
    served = ServedWorkflows(served_workflows(args), manager)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    offload = _offload_kind(args, device.type == "cuda")
    where = enable_offload(manager, offload, device, args.budget, args.margin, args.host_budget)
    scheduler = Scheduler(
        served,
        args.state or SERVE_STATE,
        device=device if offload == "none" and device.type == "cuda" else None,
        **queue_options(args),
    )
    stop = stop or threading.Event()
    server = None
    waiting = 0
    try:
        with stop_on_signals(stop):
            server = start_server(make_app(scheduler, settings), settings)
            scheduler.start()
            out(start_line(server.url, list(served), where, settings.resolved_token()))
            wait_for_stop(stop, server.thread.is_alive)  # uvicorn may stop on its own
    finally:
        if server is not None:
            server.stop()  # first: nothing is accepted while the queue stops
        scheduler.stop()  # the running job is requeued
        waiting = len(scheduler.jobs(("queued",)))
        scheduler.close()
    jobs = "1 job waits" if waiting == 1 else f"{waiting} jobs wait"
    out(f"modular serve: stopped; {jobs} in {scheduler.state} for the next start")
    return 0
