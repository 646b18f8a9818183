"""``modular serve --ray REPO_OR_WORKFLOW...``: the HTTP API and page of ``modular serve`` on Ray Serve, in the
foreground.

The options are checked first (``check_ray_options``: Ray's options without ``--ray``, and those of one
machine's server with it, are refused; neither Ray nor torch is imported). Then the served repos are read
(``modular.ray_serve.build_app``: the router's table of needs), a local Ray cluster is started (or the one of
``--ray-address`` joined), Ray Serve's proxy is bound to ``--host`` and ``--port``, the application runs as
``modular`` at ``/``, and one line says where it listens and how many replicas serve; it serves until SIGINT
or SIGTERM. Stopping deletes the application (on a local cluster: shuts Serve and Ray down). The ingress
keeps jobs in memory, so unfinished jobs are lost. See docs/serving.md ("From the command line").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import attrs

from modular.cli.serve_command import (
    RAY_EXTRA,
    queue_options,
    require_extra,
    served_workflows,
    server_settings,
    start_line,
    stop_on_signals,
    wait_for_stop,
)

__all__ = [
    "APP_NAME",
    "RAY_DEFAULTS",
    "check_ray_arguments",
    "check_ray_options",
    "missing_ray",
    "serve_ray_command",
    "where_models_run",
]

APP_NAME = "modular"
#: The defaults of the Ray options left ``None`` by the parser (``None`` there tells "not given").
RAY_DEFAULTS: dict[str, Any] = {
    "replicas": 2,
    "cpus_per_replica": 1.0,
    "imbalance": 1.0,  # DEFAULT_IMBALANCE (not imported: the refusals import no torch)
    "stats_period": 1.0,
    "tries": 3,
}
_RAY_ONLY = (
    ("ray_address", "--ray-address"),
    ("replicas", "--replicas"),
    ("autoscale", "--autoscale"),
    ("gpus_per_replica", "--gpus-per-replica"),
    ("cpus_per_replica", "--cpus-per-replica"),
    ("imbalance", "--imbalance"),
    ("stats_period", "--stats-period"),
    ("tries", "--tries"),
)
_REPLICA_OFFLOAD = "each replica offloads onto a simulated device of --budget, else onto its own GPU"
_NOT_WITH_RAY = (
    ("state", "--state", "the ingress keeps jobs in memory"),
    ("offload", "--offload", _REPLICA_OFFLOAD),
    ("margin", "--margin", _REPLICA_OFFLOAD),
    ("host_budget", "--host-budget", _REPLICA_OFFLOAD),
    ("threads", "--threads", "Ray gives each replica its threads by --cpus-per-replica"),
)
PROXY_WAIT = 60.0  # seconds the proxy of a local cluster has to answer after the application runs


def _listed(options: list[str]) -> str:
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} and {options[-1]}"


def check_ray_options(args: argparse.Namespace) -> None:
    """Refuse Ray's options without ``--ray``, and with it the options of one machine's server (imports
    neither Ray nor torch).

    Raises:
        ValueError: one line naming every such option, and ``--port 0`` with ``--ray-address``.
    """
    if not args.ray:
        given = [option for key, option in _RAY_ONLY if getattr(args, key, None) is not None]
        if given:
            are, them = ("is an option", "it") if len(given) == 1 else ("are options", "them")
            msg = f"{_listed(given)} {are} of --ray: add --ray, or drop {them}"
            raise ValueError(msg)
        return
    refused = [(option, why) for key, option, why in _NOT_WITH_RAY if getattr(args, key, None) is not None]
    if refused:
        options = [option for option, _ in refused]
        reasons = list(dict.fromkeys(why for _, why in refused))
        verb, them = ("does", "it") if len(options) == 1 else ("do", "them")
        msg = f"{_listed(options)} {verb} not apply with --ray ({'; '.join(reasons)}); drop {them}"
        raise ValueError(msg)
    if args.port == 0 and args.ray_address is not None:
        msg = (
            "--port 0 picks a free port of this machine, but on a joined cluster (--ray-address) Ray Serve's "
            "proxies listen on every node: give a --port"
        )
        raise ValueError(msg)


def missing_ray() -> str | None:
    """The one line ``modular serve --ray`` answers with where Ray Serve is not installed, else ``None``."""
    try:
        importlib.import_module("ray.serve")
    except ImportError:
        return f"modular serve: error: --ray needs Ray Serve: {RAY_EXTRA}"
    return None


def check_ray_arguments(args: argparse.Namespace) -> None:
    """What ``check_serve_arguments`` checks of one machine's server that applies to Ray: the address and
    token, the extra ``serve`` (the ingress serves its app), the served workflows (imports torch).

    Raises:
        ValueError, ImportError: as ``check_serve_arguments`` (and ``check_ray_options``).
    """
    check_ray_options(args)
    server_settings(args).check()
    require_extra()
    served_workflows(args)


def where_models_run(args: argparse.Namespace) -> str:
    """Where the models are, for the start line: the replicas and each one's device."""
    from offload.devices.units import format_bytes

    if args.autoscale is not None:
        count = f"{args.autoscale[0]} to {args.autoscale[1]} Ray Serve replicas (autoscaled)"
    else:
        replicas = args.replicas or RAY_DEFAULTS["replicas"]
        count = f"{replicas} Ray Serve replica{'s' if replicas != 1 else ''}"
    gpus = 1 if args.gpus_per_replica is None else args.gpus_per_replica
    if args.budget is not None:
        device = f"a simulated device of {format_bytes(args.budget)} each"
    else:
        device = f"{gpus:g} GPU each" if gpus else "no GPU"
    return f"{count}, {device}"


def _wait_for_proxy(host: str, port: int, timeout: float = PROXY_WAIT) -> None:
    """Return once ``GET /healthz`` answers on the proxy (Ray starts it beside the application).

    Raises:
        RuntimeError: it did not answer within ``timeout`` seconds.
    """
    near = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"http://{f'[{near}]' if ':' in near else near}:{port}/healthz"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            msg = f"Ray Serve's proxy did not answer on {url} within {timeout:g} s; see Ray's log (/tmp/ray)"
            raise RuntimeError(msg)
        time.sleep(0.2)


def serve_ray_command(
    args: argparse.Namespace,
    out: Callable[[str], Any] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve on Ray Serve until SIGINT, SIGTERM or ``stop`` is set; returns the exit status (0). ``out``
    takes the lines said on start and stop (default: printed at once).

    Raises:
        ValueError, ImportError: the refusals of ``check_ray_arguments``.
        FileNotFoundError, JobFileError: a repo that cannot be read.
        OSError: the port is taken (a local cluster). RuntimeError: the proxy did not answer.
        ConnectionError: no cluster at ``--ray-address``.
    """
    check_ray_arguments(args)
    out = out or functools.partial(print, flush=True)
    import ray
    from ray import serve

    from modular.http.server import bind_socket
    from modular.ray_serve import build_app

    settings = server_settings(args)
    local = args.ray_address is None
    port = args.port
    if local:  # a port in use is one clear line before Ray starts; port 0: a free one, found here
        with contextlib.closing(bind_socket(settings)) as sock:
            port = sock.getsockname()[1]
    settings = attrs.evolve(settings, port=port)
    autoscaling = None
    if args.autoscale is not None:
        autoscaling = {"min_replicas": args.autoscale[0], "max_replicas": args.autoscale[1]}
    value = {
        key: default if getattr(args, key) is None else getattr(args, key)
        for key, default in RAY_DEFAULTS.items()
    }
    workflows = served_workflows(args)
    app = build_app(  # reads the repos: a missing one is refused before Ray starts
        workflows,
        value["replicas"],
        args.budget,
        value["imbalance"],
        value["stats_period"],
        base=os.getcwd(),
        settings=settings,
        tries=value["tries"],
        num_gpus=args.gpus_per_replica,
        num_cpus=value["cpus_per_replica"],
        autoscaling=autoscaling,
        **queue_options(args),
    )
    stop = stop or threading.Event()
    try:
        # Ray's own logs stay in its log folder (/tmp/ray/session_latest/logs): this command's output is its
        # two lines. A local cluster is this machine's alone: on loopback, without the dashboard.
        if local:
            ray.init(
                address="local", include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1"
            )
        else:
            ray.init(address=args.ray_address, log_to_driver=False)
        serve.start(http_options={"host": settings.host, "port": port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        if local:
            _wait_for_proxy(settings.host, port)
        with stop_on_signals(stop):  # after ray.init, which sets its own SIGTERM handler
            host = f"[{settings.host}]" if ":" in settings.host else settings.host
            names = [workflow.name for workflow in workflows]
            out(start_line(f"http://{host}:{port}", names, where_models_run(args), settings.resolved_token()))
            wait_for_stop(stop, ray.is_initialized)
    finally:
        if ray.is_initialized():
            # The replicas stop as Ray Serve stops them (each scheduler closed, its folder removed); on a joined
            # cluster Serve stays up for other applications, a local cluster ends with its driver.
            with contextlib.suppress(Exception):  # nothing of the application started: nothing to delete
                serve.delete(APP_NAME)
            ray.shutdown()
    where = (
        "Ray Serve and the local Ray cluster shut down"
        if local
        else f"the application {APP_NAME!r} deleted from the cluster"
    )
    out(f"modular serve: stopped; {where}; unfinished jobs are lost (the ingress kept them in memory)")
    return 0
