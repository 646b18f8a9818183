"""Serving under auto offload: a simulated device that holds one family's models at a time, then a host budget
with a disk tier. The scheduler's results equal the direct calls (a manager of their own, no offload); models
leave the device only when the queue switches families; after many switches no weight is lost."""

from __future__ import annotations

import pytest
import torch

from components import ComponentsManager
from components.load_id import get_load_id
from modular.serving import Scheduler
from offload import SimulatedDevice, module_nbytes

from .durable_helpers import (
    DirectCalls,
    assert_same_weights,
    request,
    result_bytes,
    served,
    tiny_repo,
)


@pytest.fixture(scope="module")
def workflows(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "repos"
    return {"sd": (tiny_repo(root, "sd"), None), "flux": (tiny_repo(root, "flux"), None)}


@pytest.fixture(scope="module")
def direct(workflows):
    return DirectCalls(workflows)


def families(manager: ComponentsManager, workflows) -> dict[str, str]:
    """Each registered model's id -> the served workflow whose repo it came from."""
    repos = {str(repo): name for name, (repo, _) in workflows.items()}
    found = {}
    for component_id, obj in manager.components.items():
        if isinstance(obj, torch.nn.Module):
            found[component_id] = repos[get_load_id(obj).split("|")[0]]
    return found


def loaded(manager: ComponentsManager, workflows):
    """The workflows on ``manager``, their models loaded (so that their sizes are known), and per family the
    bytes of its models."""
    workflows_served = served(manager, workflows)
    for name in workflows:
        workflows_served.load(name)
    owner = families(manager, workflows)
    sizes = dict.fromkeys(workflows, 0)
    for component_id, family in owner.items():
        sizes[family] += module_nbytes(manager.components[component_id])
    return workflows_served, owner, sizes


def left_the_device(decisions) -> list[str]:
    """The models the decisions took off the device, whole or down to a prefix."""
    gone = [model_id for decision in decisions for model_id in decision.evicted]
    return gone + [decision.model_id for decision in decisions if decision.reason == "shrink"]


#: Jobs submitted one at a time (each runs before the next arrives): runs of four of one family.
RUNS = ["flux"] * 4 + ["sd"] * 4 + ["flux"] * 4


def moves_per_job(workflows, direct, state, sequence):
    """Run ``sequence`` (workflow names) one job at a time on a device that holds one family at a time;
    per job, its workflow and the models that left the device while it ran. Checks every result against the
    direct call."""
    manager = ComponentsManager()
    workflows_served, _, sizes = loaded(manager, workflows)
    budget = max(sizes.values()) + min(sizes.values()) // 2  # either family fits; both do not
    assert budget < sum(sizes.values())
    manager.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    scheduler = Scheduler(workflows_served, state)
    moves = []
    try:
        for seed, name in enumerate(sequence):
            job = scheduler.submit(request(name, seed))
            before = len(manager.offload_log)
            assert scheduler.run_next() is job
            scheduler.wait_prefetch(30)
            assert job.state == "done", job.error
            moves.append((name, left_the_device(list(manager.offload_log)[before:])))
            assert result_bytes(scheduler, job.id) == direct.pngs(job.request.data)
        str(manager)  # the table prints under offload
    finally:
        scheduler.close()
        manager.disable_auto_cpu_offload()
    return moves


def same_family_before(moves, number: int) -> int:
    """How many jobs right before job ``number`` ran its family."""
    count = 0
    while count < number and moves[number - count - 1][0] == moves[number][0]:
        count += 1
    return count


def test_a_run_of_one_family_settles_and_moves_nothing_until_the_queue_switches(workflows, direct, tmp_path):
    """Models leave the device at a switch of families (and in the next two jobs: see the next test); the
    fourth job of a run moves nothing, nor does any later one until the other family's job comes."""
    moves = moves_per_job(workflows, direct, tmp_path / "state", RUNS)
    for number, (name, gone) in enumerate(moves):
        if number > 0 and same_family_before(moves, number) == 0:
            assert gone, f"job {number} ({name}) switched families, yet nothing left the device"
        if number == 0 or same_family_before(moves, number) >= 3:
            assert not gone, f"job {number} ({name}), the fourth of its run or later, evicted {gone}"


def test_the_second_job_of_a_run_moves_nothing(workflows, direct, tmp_path):
    # Right after a switch the previous family dominates the engine's history of plans; the scheduler tells
    # the engine which calls come next (OffloadEngine.expect_calls), so the new run keeps its own models.
    moves = moves_per_job(workflows, direct, tmp_path / "state", RUNS[:8])
    late = [
        (number, gone) for number, (_, gone) in enumerate(moves) if same_family_before(moves, number) >= 1
    ]
    assert all(not gone for _, gone in late), late


def test_a_host_budget_with_a_disk_tier_loses_no_weights_over_many_switches(workflows, direct, tmp_path):
    manager = ComponentsManager()
    workflows_served, owner, sizes = loaded(manager, workflows)
    largest = max(module_nbytes(manager.components[component_id]) for component_id in owner)
    budget = max(sizes.values()) + min(sizes.values()) // 2
    manager.enable_auto_cpu_offload(
        device=SimulatedDevice(budget),
        memory_reserve_margin=0,
        host_budget=largest,  # the host holds the largest model's copy, hardly more: the rest is on disk
        spill_folder=tmp_path / "spill",
    )
    scheduler = Scheduler(workflows_served, tmp_path / "state")
    try:
        jobs = []
        for seed, name in enumerate(["sd", "flux"] * 4):  # one at a time: every job switches families
            job = scheduler.submit(request(name, seed))
            assert scheduler.run_next() is job
            scheduler.wait_prefetch(30)
            assert job.state == "done", job.error
            jobs.append(job)
        log = manager.offload_log
        assert log.total_bytes_from_disk > 0  # models were read back from their files
        assert log.total_bytes_to_disk == 0  # none changed: nothing spilled
        for job in jobs:
            assert result_bytes(scheduler, job.id) == direct.pngs(job.request.data)
        reasons = {decision.reason for decision in log}
        assert {"drop host copy", "disk read"} <= reasons, reasons
        assert_same_weights(manager, direct.served.manager)
    finally:
        scheduler.close()
        manager.disable_auto_cpu_offload()
    assert_same_weights(manager, direct.served.manager)  # read back whole when offload is turned off
