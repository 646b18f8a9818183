"""Running jobs: results equal the direct call for each family; cancel (waiting and running), pause and
resume, a per-job timeout; a failed job (an exception in a block, out of memory, bad input found late)
fails alone while the queue, the manager and other jobs go on."""

from __future__ import annotations

import threading

import PIL.Image
import pytest
import torch

from modular.serving import EventHub, JobStateError, UnknownJobError

from .conftest import SMALL, drain, requests_of, results

WAIT = 60.0  # seconds any wait of these tests gives up after (a bound, never a measure)


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
def hub():
    hub = BlockingHub()
    yield hub
    hub.release.set()  # a failed test leaves no worker blocked


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


# -- cancel ----------------------------------------------------------------------------------------------
def test_cancel_a_waiting_job(make_scheduler, direct):
    scheduler = make_scheduler("sd")
    requests = requests_of(["sd", "sd", "sd"])
    ids = [scheduler.submit(request).id for request in requests]
    with scheduler.events.subscribe(ids[1]) as listener:
        cancelled = scheduler.cancel(ids[1], "changed my mind")
        assert cancelled.state == "cancelled" and cancelled.error == "changed my mind"
        kinds = []
        while (event := listener.get(timeout=0)) is not None:
            kinds.append(event)
    assert [event["kind"] for event in kinds][-1] == "cancelled"
    assert kinds[-1]["error"] == "changed my mind"
    record = scheduler.store.get(ids[1])
    assert (record.state, record.error, record.attempts) == ("cancelled", "changed my mind", 0)
    assert scheduler.position(ids[1]) is None and scheduler.position(ids[2]) == 2
    assert drain(scheduler) == [ids[0], ids[2]]
    assert results(scheduler, ids[1]) == []
    for job_id in (ids[0], ids[2]):
        assert results(scheduler, job_id) == direct(requests[ids.index(job_id)])


def test_cancel_the_running_job_stops_it_and_the_next_runs(make_scheduler, direct, hub):
    scheduler = make_scheduler("sd", events=hub)
    running = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1, "steps": 3})
    after = {**SMALL, "workflow": "sd", "seed": 2}
    hub.job = running.id
    with hub.subscribe(running.id) as listener:
        scheduler.start()
        assert hub.reached.wait(WAIT)
        nxt = scheduler.submit(after)
        assert scheduler.position(running.id) == 0 and scheduler.running is running
        assert scheduler.cancel(running.id, "the client left").state == "running"  # stops at its next step
        hub.release.set()
        assert scheduler.wait_idle(WAIT)
        events = []
        while (event := listener.get(timeout=0)) is not None:
            events.append(event)
    described = scheduler.describe(running.id)
    assert (described["state"], described["error"], described["results"]) == (
        "cancelled",
        "the client left",
        [],
    )
    assert [event["kind"] for event in events if event["kind"] in ("done", "failed", "cancelled")] == [
        "cancelled"
    ]
    assert max(event["step"] for event in events if event["kind"] == "step") < 3  # it stopped mid-loop
    assert scheduler.store.get(running.id).state == "cancelled"
    assert _final(scheduler, nxt.id) == "done"
    assert results(scheduler, nxt.id) == direct(after)


def test_cancel_a_finished_job_is_a_state_error(make_scheduler):
    scheduler = make_scheduler("sd")
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    drain(scheduler)
    with pytest.raises(JobStateError, match=rf"job '{job.id}' is done; there is nothing to cancel"):
        scheduler.cancel(job.id)
    cancelled = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    scheduler.cancel(cancelled.id)
    with pytest.raises(JobStateError, match="is cancelled"):
        scheduler.cancel(cancelled.id)
    assert _final(scheduler, job.id) == "done"


def test_cancel_an_unknown_job(make_scheduler):
    scheduler = make_scheduler("sd")
    with pytest.raises(UnknownJobError) as unknown:
        scheduler.cancel("nope")
    assert str(unknown.value) == "no job has id 'nope'"
    with pytest.raises(UnknownJobError):
        scheduler.describe("nope")


# -- pause, resume ---------------------------------------------------------------------------------------
def test_paused_queue_starts_nothing_by_hand_until_resumed(make_scheduler):
    scheduler = make_scheduler("sd")
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    with scheduler.events.subscribe() as listener:
        scheduler.pause()
        assert scheduler.paused and scheduler.run_next() is None
        assert _final(scheduler, job.id) == "queued" and scheduler.position(job.id) == 1
        scheduler.resume()
        assert [listener.get(timeout=0)["kind"] for _ in range(2)] == ["paused", "resumed"]
    assert drain(scheduler) == [job.id]


def test_pause_lets_the_running_job_finish_and_holds_the_next(make_scheduler, hub):
    scheduler = make_scheduler("sd", events=hub)
    first = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    hub.job = first.id
    scheduler.start()
    assert hub.reached.wait(WAIT)
    second = scheduler.submit({**SMALL, "workflow": "sd", "seed": 2})
    scheduler.pause()
    hub.release.set()
    assert not scheduler.wait_idle(0.5)  # the second job waits (a bound: it may not start at all)
    assert _final(scheduler, first.id) == "done"
    assert _final(scheduler, second.id) == "queued" and scheduler.position(second.id) == 1
    scheduler.resume()
    assert scheduler.wait_idle(WAIT)
    assert _final(scheduler, second.id) == "done"


# -- timeouts --------------------------------------------------------------------------------------------
class TimeoutHub(EventHub):
    """Holds the first step of every job with a timeout under a second until that job's cancel is set (its
    timer fired), so such a timeout always falls mid-call."""

    def __init__(self, scheduler_of) -> None:
        super().__init__()
        self.scheduler_of = scheduler_of

    def publish(self, kind, job_id=None, **fields):
        event = super().publish(kind, job_id, **fields)
        if kind == "step" and fields.get("step") == 1:
            job = self.scheduler_of().job(job_id)
            if job.request.timeout is not None and job.request.timeout < 1:
                assert job.token._event.wait(WAIT), "the timeout never fired"
        return event


def test_a_job_over_its_timeout_fails_and_the_next_runs(make_scheduler, direct):
    holder = {}
    scheduler = holder["s"] = make_scheduler("sd", events=TimeoutHub(lambda: holder["s"]))
    slow = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1, "timeout": 0.05})
    after = {**SMALL, "workflow": "sd", "seed": 2, "timeout": 600}
    nxt = scheduler.submit(after)
    assert drain(scheduler) == [slow.id, nxt.id]
    described = scheduler.describe(slow.id)
    assert (described["state"], described["error"], described["results"]) == (
        "failed",
        "timed out after 0.05 s",
        [],
    )
    assert scheduler.store.get(slow.id).error == "timed out after 0.05 s"
    assert _final(scheduler, nxt.id) == "done" and results(scheduler, nxt.id) == direct(after)


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


# -- stop and start --------------------------------------------------------------------------------------
def test_a_job_stopped_mid_call_runs_again_on_the_next_start(make_scheduler, direct, hub):
    scheduler = make_scheduler("sd", events=hub)
    request = {**SMALL, "workflow": "sd", "seed": 1, "steps": 3}
    job = scheduler.submit(request)
    hub.job = job.id
    scheduler.start()
    assert hub.reached.wait(WAIT)
    stopper = threading.Thread(target=scheduler.stop)
    stopper.start()
    hub.release.set()
    stopper.join(WAIT)
    described = scheduler.describe(job.id)
    assert (described["state"], described["attempts"], described["error"]) == ("queued", 1, None)
    assert scheduler.store.get(job.id).state == "queued"
    assert scheduler.position(job.id) == 1
    scheduler.start()
    assert scheduler.wait_idle(WAIT)
    described = scheduler.describe(job.id)
    assert (described["state"], described["attempts"]) == ("done", 2)
    assert results(scheduler, job.id) == direct(request)


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


def test_cancel_while_the_job_s_pipeline_loads_ends_it_cancelled_before_any_step(make_scheduler, monkeypatch):
    scheduler = make_scheduler("sd")
    loading, release = threading.Event(), threading.Event()
    load = scheduler.served.load

    def slow_load(name, on_cuda=False):
        loading.set()
        assert release.wait(WAIT)
        return load(name, on_cuda)

    monkeypatch.setattr(scheduler.served, "load", slow_load)
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    with scheduler.events.subscribe(job.id) as listener:
        scheduler.start()
        assert loading.wait(WAIT)
        scheduler.cancel(job.id, "no longer wanted")
        release.set()
        assert scheduler.wait_idle(WAIT)
        kinds = []
        while (event := listener.get(timeout=0)) is not None:
            kinds.append(event["kind"])
    described = scheduler.describe(job.id)
    assert (described["state"], described["error"], described["results"]) == (
        "cancelled",
        "no longer wanted",
        [],
    )
    assert "step" not in kinds and kinds[-1] == "cancelled"
