"""Direct pipeline calls in another thread while the scheduler's worker runs jobs on the same manager (its
pipelines share their models by load ID): every job's result and every direct call equal the calls made alone,
with auto offload off and on a device that holds one family at a time (the threads then wait for each other's
running models)."""

from __future__ import annotations

import threading

import pytest
import torch

from components import ComponentsManager
from modular.serving import Scheduler
from offload import SimulatedDevice, module_nbytes

from .durable_helpers import DirectCalls, request, result_bytes, served, tiny_repo

CALLS = 6  # direct calls in the other thread


@pytest.fixture(scope="module")
def workflows(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "repos"
    return {"sd": (tiny_repo(root, "sd"), None), "flux": (tiny_repo(root, "flux"), None)}


@pytest.fixture(scope="module")
def alone(workflows):
    return DirectCalls(workflows)


@pytest.mark.parametrize("offload", [False, True], ids=["no offload", "one family on the device"])
def test_direct_calls_beside_the_scheduler_on_one_manager(workflows, alone, tmp_path, offload):
    manager = ComponentsManager()
    workflows_served = served(manager, workflows)
    # The other thread's pipeline, on the same manager: the SD models are the scheduler's own.
    beside = DirectCalls({"sd-beside": workflows["sd"]}, manager)
    beside.served.load("sd-beside")
    if offload:
        for name in workflows:
            workflows_served.load(name)
        sizes = {name: 0 for name in workflows}
        for name in workflows:
            pipe = workflows_served.pipeline(name)
            sizes[name] = sum(
                module_nbytes(getattr(pipe, component))
                for component in pipe.component_names
                if isinstance(getattr(pipe, component, None), torch.nn.Module)
            )
        budget = max(sizes.values()) + min(sizes.values()) // 2
        manager.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    assert beside.served.pipeline("sd-beside").unet is workflows_served.load("sd").unet

    scheduler = Scheduler(workflows_served, tmp_path / "state")
    direct_request = request("sd-beside", 99)
    expected = alone.pngs({**direct_request, "workflow": "sd"})
    got: list[list[bytes]] = []
    errors: list[BaseException] = []
    started = threading.Event()

    def call_beside() -> None:
        try:
            started.wait(30)
            for _ in range(CALLS):
                got.append(beside.pngs(direct_request))
        except BaseException as error:  # noqa: BLE001 - reported in the test's thread
            errors.append(error)

    thread = threading.Thread(target=call_beside, name="direct-calls")
    try:
        scheduler.start()
        thread.start()
        jobs = [scheduler.submit(request(name, seed)) for seed, name in enumerate(["flux", "sd"] * 4)]
        started.set()
        assert scheduler.wait_idle(120), scheduler.jobs()
        thread.join(120)
        assert not thread.is_alive()
        assert not errors, errors
        assert got == [expected] * CALLS
        for job in jobs:
            assert job.state == "done", job.error
            assert result_bytes(scheduler, job.id) == alone.pngs(job.request.data), job.workflow
        str(manager)
    finally:
        started.set()
        thread.join(120)
        scheduler.close()
        if offload:
            manager.disable_auto_cpu_offload()
