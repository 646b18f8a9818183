"""A served queue over tiny SD and Flux repos, for the load, fault and schema tests (helper fixtures of
their own, beside ``tests/http/conftest.py``'s): the server runs in this process, on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx

from blocks.flux import make_tiny_repo as make_tiny_flux
from blocks.stable_diffusion import make_tiny_repo as make_tiny_sd
from components import ComponentsManager
from modular.batch.jobs import Job, call_job
from modular.batch.store import encode
from modular.http import ServerSettings, make_app, start_server
from modular.http.server import RunningServer
from modular.serving import Limits, Scheduler, ServedWorkflows, parse_served

SD = "tiny-sd"
FLUX = "tiny-flux:text2image"
FINAL = ("done", "failed", "cancelled")


def make_repos(folder: Path) -> Path:
    """Both tiny repos under ``folder`` (``tiny-sd``, ``tiny-flux``); returns ``folder``."""
    make_tiny_sd(folder / "tiny-sd")
    make_tiny_flux(folder / "tiny-flux")
    return folder


def served_workflows(repos: Path, manager: ComponentsManager | None = None) -> ServedWorkflows:
    """``tiny-sd`` (the whole pipeline) and ``tiny-flux:text2image`` from ``repos``, on ``manager``."""
    workflows = [parse_served(f"{SD}"), parse_served(FLUX)]
    return ServedWorkflows(workflows, manager or ComponentsManager(), base=repos)


@attrs.define
class Served:
    """A running server and the scheduler behind it."""

    scheduler: Scheduler
    server: RunningServer
    settings: ServerSettings

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, **options: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **options)


@contextlib.contextmanager
def serving(
    repos: Path, state: Path, *, limits: Limits | None = None, start: bool = True, **settings: object
) -> Iterator[Served]:
    """A scheduler over both tiny repos (started unless ``start`` is false: then jobs only wait) and its
    server on a free port; both stopped on exit."""
    scheduler = Scheduler(
        served_workflows(repos),
        state,
        limits=limits or Limits(max_steps=2, max_pixels=64 * 64),
        max_queue=500,
    )
    server_settings = ServerSettings(port=0, **settings)
    if start:
        scheduler.start()
    try:
        server = start_server(make_app(scheduler, server_settings), server_settings)
    except BaseException:
        scheduler.close()
        raise
    try:
        yield Served(scheduler, server, server_settings)
    finally:
        server.stop()
        scheduler.close()


class DirectCalls:
    """The direct call's PNG for a job's prompt and seed, on pipelines of a manager of their own (never
    the server's), each made once."""

    def __init__(self, repos: Path) -> None:
        self.repos = repos
        self.served = served_workflows(repos)
        self._pngs: dict[tuple[str, str, int, int, str], bytes] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        for name in self.served:
            self.served.load(name)

    def png(self, workflow: str, prompt: str, seed: int, steps: int = 1, size: str = "32x32") -> bytes:
        key = (workflow, prompt, seed, steps, size)
        with self._lock:
            if key not in self._pngs:
                width, height = (int(part) for part in size.split("x"))
                pipe = self.served.load(workflow)
                served = self.served[workflow]
                job = Job(
                    "direct",
                    self.served.repo_path(served),
                    served.workflow,
                    {"prompt": prompt, "num_inference_steps": steps, "width": width, "height": height},
                    seed,
                )
                self._pngs[key] = encode(call_job(pipe, job), "png")
            return self._pngs[key]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
