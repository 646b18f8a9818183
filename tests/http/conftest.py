"""Fixtures of the HTTP tests: tiny repos made once per session, and servers on a free loopback port.

``serve(...)`` starts a scheduler over one new ComponentsManager and a real uvicorn server (port 0) and
answers a ``ServedServer(scheduler, server, client)``; everything it started is stopped at teardown
(client closed, server stopped, scheduler closed) and the test fails if a thread is left. ``served_server``
is one with the defaults: the tiny SD repo's whole pipeline as ``tiny-sd`` and the tiny Flux repo's
text-to-image as ``tiny-flux``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import httpx
import pytest
import torch

from blocks.flux import make_tiny_repo as make_tiny_flux
from blocks.stable_diffusion import make_tiny_repo as make_tiny_sd
from components import ComponentsManager
from modular.batch.jobs import Job, call_job
from modular.batch.runner import enable_offload
from modular.batch.store import encode
from modular.http import RunningServer, ServerSettings, make_app, start_server
from modular.serving import Limits, Scheduler, ServedWorkflows, parse_served
from tests.http.helpers import FLUX, SD
from tests.threads import threads_left


@attrs.frozen
class TinyRepos:
    """The session's tiny repos (local folders)."""

    sd: Path
    flux: Path

    def served(self) -> tuple[str, str]:
        """The default served workflows: SD's whole pipeline (text or image to image) and Flux text-to-image."""
        return (f"{SD}={self.sd}", f"{FLUX}={self.flux}:text2image")


class ServedServer(NamedTuple):
    """A running server: its scheduler, the uvicorn server and a client of its URL."""

    scheduler: Scheduler
    server: RunningServer
    client: httpx.Client


@pytest.fixture(scope="session")
def tiny_repos(tmp_path_factory: pytest.TempPathFactory) -> TinyRepos:
    folder = tmp_path_factory.mktemp("http-repos")
    return TinyRepos(sd=make_tiny_sd(folder / SD), flux=make_tiny_flux(folder / FLUX))


ServeFactory = Callable[..., ServedServer]


@pytest.fixture
def serve(tiny_repos: TinyRepos, tmp_path: Path) -> Iterator[ServeFactory]:
    """``serve(*served, settings=, token=, limits=, state=, start=, sim_budget=, authorize=, **scheduler)``:
    a started server (see the module docstring).

    Args of the factory:
        served: ``NAME=REPO[:WORKFLOW]`` texts (default: ``tiny-sd`` and ``tiny-flux``).
        settings: The server's settings (default: loopback, port 0); ``token`` sets its token.
        limits: The scheduler's ``Limits``.
        state: Its state folder (default: ``tmp_path/state``; ``None`` keeps jobs in memory).
        start: Start the scheduler's worker (``False``: jobs wait until the test runs them).
        sim_budget: Auto offload onto a simulated device of this many bytes (``None``: no offload).
        authorize: The client sends the token (when there is one).
        scheduler: Further keywords of ``Scheduler`` (``max_queue``, ``events``, ``preview_every``...).
    """
    started: list[ServedServer] = []
    threads_before = set(threading.enumerate())

    def make(
        *served: str,
        settings: ServerSettings | None = None,
        token: str | None = None,
        limits: Limits | None = None,
        state: Path | None | str = "default",
        start: bool = True,
        sim_budget: int | None = None,
        authorize: bool = True,
        **scheduler_options: Any,
    ) -> ServedServer:
        settings = settings or ServerSettings(port=0)
        if token is not None:
            settings = attrs.evolve(settings, token=token)
        manager = ComponentsManager()
        workflows = ServedWorkflows([parse_served(text) for text in served or tiny_repos.served()], manager)
        if sim_budget is not None:
            enable_offload(manager, "sim", torch.device("cpu"), sim_budget)
        folder = tmp_path / f"state-{len(started)}" if state == "default" else state
        scheduler = Scheduler(workflows, folder, limits=limits, **scheduler_options)
        try:
            server = start_server(make_app(scheduler, settings), settings)
        except BaseException:
            scheduler.close()
            raise
        if start:
            scheduler.start()
        headers = {"Authorization": f"Bearer {settings.token}"} if authorize and settings.token else {}
        client = httpx.Client(base_url=server.url, headers=headers, timeout=60)
        running = ServedServer(scheduler, server, client)
        started.append(running)
        return running

    yield make
    for running in reversed(started):
        running.client.close()
        running.server.stop()
        running.scheduler.close()
    for running in started:
        assert not running.server.thread.is_alive(), "the HTTP server's thread is still running"
    assert threads_left(threads_before) == []


@pytest.fixture
def served_server(serve: ServeFactory) -> ServedServer:
    """A started server of the default workflows (``tiny-sd``, ``tiny-flux``), jobs stored under ``tmp_path``."""
    return serve()


DirectCall = Callable[..., bytes]


@pytest.fixture(scope="session")
def direct(tiny_repos: TinyRepos) -> DirectCall:
    """``direct(workflow, seed, **inputs)``: the PNG bytes ``call_job`` makes of those pipeline inputs on the
    default workflows' pipelines, loaded once on a manager of their own (the parity reference: the inputs
    are written by hand, not translated from a request by the server's code)."""
    served = ServedWorkflows([parse_served(text) for text in tiny_repos.served()], ComponentsManager())

    def call(workflow: str, seed: int, **inputs: Any) -> bytes:
        pipe = served.load(workflow)
        return encode(
            call_job(pipe, Job(workflow, str(served[workflow].repo), inputs=inputs, seed=seed)), "png"
        )

    return call
