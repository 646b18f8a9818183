"""Fixtures the scheduler tests share: tiny repos of three families (made once per session), a factory of
schedulers over one manager with their state in the test's folder (closed at teardown), the direct call a
job's results must equal, and an event hub that holds a job mid-step while the test acts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from components import ComponentsManager
from modular.batch.jobs import call_job
from modular.batch.store import encode
from modular.serving import EventHub, Scheduler, ServedWorkflow, ServedWorkflows, check_request
from modular.serving.requests import open_images
from offload import SimulatedDevice, module_nbytes

#: Requests of these tests: tiny images, two steps.
SMALL = {"prompt": "a red fox", "steps": 2, "size": "32x32"}
WAIT = 60.0  # seconds any wait of these tests gives up after (a bound, never a measure)


def fail_loading(
    monkeypatch: pytest.MonkeyPatch, scheduler: Scheduler, workflow: str, error: Exception
) -> None:
    """``scheduler``'s loads of ``workflow`` raise ``error`` from now on; the others load as before."""
    load = scheduler.served.load

    def failing(name: str, on_cuda: bool = False) -> Any:
        if name == workflow:
            raise error
        return load(name, on_cuda)

    monkeypatch.setattr(scheduler.served, "load", failing)


@pytest.fixture(scope="session")
def serving_repos(tmp_path_factory) -> dict[str, Path]:
    """Tiny repos of three families (SD, Flux, Z-Image), written once per session."""
    from blocks.flux import make_tiny_repo as flux_repo
    from blocks.stable_diffusion import make_tiny_repo as sd_repo
    from blocks.z_image import make_tiny_repo as z_image_repo

    folder = tmp_path_factory.mktemp("serving-repos")
    return {
        "sd": sd_repo(folder / "tiny-sd"),
        "flux": flux_repo(folder / "tiny-flux"),
        "zimage": z_image_repo(folder / "tiny-zimage"),
    }


@pytest.fixture(scope="session")
def workflows(serving_repos) -> dict[str, ServedWorkflow]:
    """The served workflows tests pick from, by name: ``sd`` (the whole SD pipeline), ``sd-i2i`` (its
    image2image workflow: the same repo, so the same models), ``flux`` and ``zimage``."""
    return {
        "sd": ServedWorkflow("sd", str(serving_repos["sd"])),
        "sd-i2i": ServedWorkflow("sd-i2i", str(serving_repos["sd"]), "image2image"),
        "flux": ServedWorkflow("flux", str(serving_repos["flux"])),
        "zimage": ServedWorkflow("zimage", str(serving_repos["zimage"])),
    }


def family_bytes(workflows: dict[str, ServedWorkflow], *names: str) -> dict[str, int]:
    """The model bytes of each named workflow's pipeline, loaded on a manager of its own."""
    sizes = {}
    for name in names:
        pipe = ServedWorkflows([workflows[name]], ComponentsManager()).load(name)
        sizes[name] = sum(
            module_nbytes(getattr(pipe, component))
            for component in pipe.pretrained_component_names
            if hasattr(getattr(pipe, component, None), "parameters")
        )
    return sizes


@pytest.fixture(scope="session")
def sizes(workflows) -> dict[str, int]:
    """The model bytes of ``sd``, ``flux`` and ``zimage``."""
    return family_bytes(workflows, "sd", "flux", "zimage")


@pytest.fixture
def make_scheduler(workflows, tmp_path) -> Iterator[Callable[..., Scheduler]]:
    """``make_scheduler(*names, budget=None, state=None, **options)``: a Scheduler serving the named workflows
    on a new manager (with auto offload onto ``SimulatedDevice(budget)`` when a budget is given), its state in
    a new folder of the test's (or ``state``); every one made is closed at teardown."""
    made: list[Scheduler] = []

    def make(*names: str, budget: int | None = None, **options: Any) -> Scheduler:
        manager = ComponentsManager()
        if budget is not None:
            manager.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
        served = ServedWorkflows([workflows[name] for name in names or ("sd",)], manager)
        options.setdefault("preview_every", None)
        state = options.pop("state", tmp_path / f"state{len(made)}")
        scheduler = Scheduler(served, state, **options)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.close()


@pytest.fixture
def direct(workflows) -> Callable[..., list[bytes]]:
    """``direct(request, uploads=None)``: the PNG bytes of each image of ``request`` made by calling its
    workflow's pipeline directly (``call_job`` on the entry's job) on a manager of its own, without a
    scheduler; ``request`` needs its seed (or seeds) for the images to be the scheduler's."""

    def run(request: dict[str, Any], uploads: dict[str, Path] | None = None) -> list[bytes]:
        served = ServedWorkflows([workflows[request["workflow"]]], ComponentsManager())
        checked = check_request(request, served, uploads)
        pipe = served.load(checked.workflow)
        images = open_images(uploads or {})
        return [encode(call_job(pipe, entry.job(images, False)), "png") for entry in checked.entries]

    return run


def results(scheduler: Scheduler, job_id: str) -> list[bytes]:
    """The bytes of each result file of a finished job."""
    return [(scheduler.results / name).read_bytes() for name in scheduler.describe(job_id)["results"]]


def drain(scheduler: Scheduler, limit: int = 50) -> list[str]:
    """Run waiting jobs by hand until none may start (at most ``limit``); the ids in the order they ran."""
    ran = []
    for _ in range(limit):
        job = scheduler.run_next()
        if job is None:
            break
        ran.append(job.id)
    return ran


def requests_of(workflows: Sequence[str], **fields: Any) -> list[dict[str, Any]]:
    """Small requests for the named workflows (seeds 0, 1, ...)."""
    return [{**SMALL, "workflow": name, "seed": seed, **fields} for seed, name in enumerate(workflows)]


class BlockingHub(EventHub):
    """An event hub whose publisher (the worker, inside a step's progress callback) stops at the first
    ``step`` event of ``job`` until the test releases it, so a test acts while that job is mid-call."""

    def __init__(self) -> None:
        super().__init__()
        self.job: str | None = None
        self.reached = threading.Event()
        self.release = threading.Event()

    def publish(self, kind, job_id=None, **fields):
        event = super().publish(kind, job_id, **fields)
        if kind == "step" and job_id is not None and job_id == self.job and not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(WAIT), "the test never released the step"
        return event


@pytest.fixture
def hub() -> Iterator[BlockingHub]:
    """A ``BlockingHub`` released at teardown."""
    hub = BlockingHub()
    yield hub
    hub.release.set()  # a failed test leaves no worker blocked
