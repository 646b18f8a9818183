"""Running jobs: results equal the direct call for each family; a failed job (an exception in a block, out of
memory, bad input found late) fails alone while the queue, the manager and other jobs go on; a finished job
read back from the store."""

from __future__ import annotations

import PIL.Image
import pytest
import torch

from .conftest import SMALL, drain, requests_of, results


def _final(scheduler, job_id):
    return scheduler.describe(job_id)["state"]


# -- results equal the direct call -----------------------------------------------------------------------
@pytest.mark.parametrize("workflow", ["sd", "flux", "zimage"])
def test_results_equal_the_direct_call(make_scheduler, direct, workflow):
    scheduler = make_scheduler(workflow)
    request = {**SMALL, "workflow": workflow, "seed": 5, "images_per_prompt": 2}
    job = scheduler.submit(request)
    assert drain(scheduler) == [job.id]
    assert _final(scheduler, job.id) == "done"
    assert scheduler.describe(job.id)["results"] == [f"{job.id}-0.png", f"{job.id}-1.png"]
    made = results(scheduler, job.id)
    assert made == direct(request)
    assert made[0] != made[1]  # seeds 5 and 6


def test_results_of_mixed_families_on_one_device_budget_equal_direct_calls(make_scheduler, direct, sizes):
    """Auto offload onto a simulated device that holds one family at a time: models move, images do not change."""
    scheduler = make_scheduler("sd", "flux", budget=max(sizes["sd"], sizes["flux"]))
    requests = requests_of(["sd", "flux", "sd", "flux"])
    ids = [scheduler.submit(request).id for request in requests]
    assert sorted(drain(scheduler)) == sorted(ids)
    for job_id, request in zip(ids, requests):
        assert results(scheduler, job_id) == direct(request)


def test_an_image2image_result_equals_the_direct_call(make_scheduler, direct, tmp_path):
    image = tmp_path / "in.png"
    PIL.Image.new("RGB", (32, 32), (200, 30, 30)).save(image)
    request = {"workflow": "sd-i2i", "prompt": "a fox", "steps": 2, "seed": 4, "inputs": {"strength": 0.6}}
    scheduler = make_scheduler("sd-i2i")
    job = scheduler.submit(request, {"image": image})
    drain(scheduler)
    assert _final(scheduler, job.id) == "done"
    assert results(scheduler, job.id) == direct(request, {"image": image})


def test_a_done_job_is_done_in_the_store_with_its_result_files(make_scheduler):
    scheduler = make_scheduler("sd")
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    drain(scheduler)
    record = scheduler.store.get(job.id)
    assert (record.state, record.results, record.attempts, record.error) == (
        "done",
        [f"{job.id}-0.png"],
        1,
        None,
    )
    assert (scheduler.results / record.results[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- a failed job fails alone ----------------------------------------------------------------------------
class Fault:
    """A fault in a class's ``forward`` that a test can turn off (an offload hook keeps the forward it
    found when the model was attached, so undoing a patch would not reach it)."""

    def __init__(self, monkeypatch, cls, error: BaseException) -> None:
        self.on = True
        original = cls.forward

        def forward(module, *args, **kwargs):
            if self.on:
                raise error
            return original(module, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", forward)


def _fails_alone(scheduler, direct, failing, other, error, fault):
    """Submit a failing job between two others; the failing one fails with an error starting ``error``; the others, and the
    failing workflow's next job once the fault is gone, equal direct calls; the manager's table prints."""
    requests = [
        {**SMALL, "workflow": other, "seed": 1},
        {**SMALL, "workflow": failing, "seed": 2},
        {**SMALL, "workflow": other, "seed": 3},
    ]
    ids = [scheduler.submit(request).id for request in requests]
    ran = drain(scheduler)
    assert sorted(ran) == sorted(ids)
    states = {job_id: scheduler.describe(job_id) for job_id in ids}
    assert states[ids[1]]["state"] == "failed" and states[ids[1]]["error"].startswith(error)
    assert scheduler.store.get(ids[1]).state == "failed"
    for index in (0, 2):
        assert states[ids[index]]["state"] == "done"
        assert results(scheduler, ids[index]) == direct(requests[index])
    assert "Models:" in str(scheduler.manager)
    fault.on = False
    again = scheduler.submit(requests[1])
    assert drain(scheduler) == [again.id]
    assert results(scheduler, again.id) == direct(requests[1])


def test_an_exception_in_a_block_fails_that_job_alone(make_scheduler, direct, monkeypatch):
    from diffusers import UNet2DConditionModel

    scheduler = make_scheduler("sd", "flux")
    fault = Fault(monkeypatch, UNet2DConditionModel, RuntimeError("the unet broke"))
    _fails_alone(scheduler, direct, "sd", "flux", "RuntimeError: the unet broke", fault)


@pytest.mark.parametrize("offload", [False, True], ids=["no-offload", "auto-offload"])
def test_out_of_memory_fails_that_job_alone(make_scheduler, direct, sizes, monkeypatch, offload):
    """Without offload the error is torch's; under auto offload the engine evicts every other model, tries
    again, and names the model that does not fit."""
    from diffusers import FluxTransformer2DModel

    budget = max(sizes["sd"], sizes["flux"]) if offload else None
    scheduler = make_scheduler("sd", "flux", budget=budget)
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    fault = Fault(monkeypatch, FluxTransformer2DModel, oom)
    if offload:
        error = "OffloadOutOfMemoryError: model 'transformer_"
    else:
        error = "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
    _fails_alone(scheduler, direct, "flux", "sd", error, fault)


def test_bad_input_found_late_fails_that_job_alone(make_scheduler, direct, monkeypatch, tmp_path):
    """An image that passes the header check but cannot be decoded when the job runs."""
    scheduler = make_scheduler("sd", "sd-i2i")
    image = tmp_path / "in.png"
    PIL.Image.new("RGB", (32, 32), (10, 200, 10)).save(image)
    late = scheduler.submit({"workflow": "sd-i2i", "prompt": "a", "steps": 2, "seed": 1}, {"image": image})
    image.write_bytes(image.read_bytes()[:60])  # truncated after it was accepted
    other = {**SMALL, "workflow": "sd", "seed": 2}
    nxt = scheduler.submit(other)
    drain(scheduler)
    described = scheduler.describe(late.id)
    assert described["state"] == "failed" and described["error"].startswith(
        "RequestError: request: image 'image' "
    )
    assert _final(scheduler, nxt.id) == "done" and results(scheduler, nxt.id) == direct(other)


# -- a job the process no longer holds -------------------------------------------------------------------
def test_a_finished_job_read_back_from_the_store_is_described_as_before(make_scheduler, tmp_path):
    """After a restart (or once the job left memory) describe gives the same keys and values."""
    state = tmp_path / "kept"
    first = make_scheduler("sd", state=state)
    job = first.submit({**SMALL, "workflow": "sd", "seed": 7, "images_per_prompt": 2})
    cancelled = first.submit({**SMALL, "workflow": "sd", "seeds": [3, 9]})
    first.cancel(cancelled.id)
    drain(first)
    before = {job_id: first.describe(job_id) for job_id in (job.id, cancelled.id)}
    first.close()
    again = make_scheduler("sd", state=state)
    for job_id, described in before.items():
        after = again.describe(job_id)
        assert sorted(after) == sorted(described)
        same = (
            "state",
            "workflow",
            "seeds",
            "images",
            "results",
            "error",
            "attempts",
            "request",
            "waited",
            "ran",
        )
        assert {key: after[key] for key in same} == {key: described[key] for key in same}
        assert after["position"] is None
