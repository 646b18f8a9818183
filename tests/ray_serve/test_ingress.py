"""The ingress (``RoutedJobs``) over replicas of this process (``LocalWorkers``): no Ray, so these run
everywhere. Results, the single machine's errors, cancel, pause, retries after a lost replica or one that
cannot load a workflow, the event stream, close, and submitters in several threads."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import pytest

from components import ComponentsManager
from modular.http.settings import ServerSettings
from modular.http.uploads import store_image
from modular.ray_serve.ingress import RoutedJobs
from modular.serving import Limits, Scheduler, ServedWorkflows
from modular.serving.events import FINAL_KINDS
from modular.serving.jobs import JobStateError, QueueFullError, UnknownJobError
from modular.serving.requests import RequestError
from tests.http.test_api import input_image

from .conftest import SMALL, WAIT, finished


def request(workflow: str = "sd", seed: int = 7, **more: Any) -> dict[str, Any]:
    return {**SMALL, "workflow": workflow, "seed": seed, **more}


def results(jobs: RoutedJobs, job_id: str) -> list[bytes]:
    return [(jobs.results / name).read_bytes() for name in jobs.describe(job_id)["results"]]


def wait_until(predicate: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def kinds(jobs: RoutedJobs, job_id: str) -> list[str]:
    return [event["kind"] for event in jobs.events.history(job_id)]


def held(one: Any, replica: str) -> None:
    """Wait until ``replica`` holds a job at its first step."""
    assert one.hubs[replica].held.wait(WAIT), f"replica {replica} never reached a step"


# -- results --------------------------------------------------------------------------------------


@pytest.mark.parametrize("workflow", ["sd", "flux"])
def test_results_through_the_ingress_equal_the_direct_call(routed, direct, workflow):
    jobs = routed().jobs
    job = jobs.submit(request(workflow, images_per_prompt=2))
    assert job["state"] == "queued" and job["seeds"] == [7, 8] and job["replica"] is None
    done = finished(jobs.describe, job["id"])
    assert done["state"] == "done", done["error"]
    assert done["replica"] in ("r1", "r2") and done["attempts"] == 1
    assert results(jobs, job["id"]) == direct(request(workflow, images_per_prompt=2))
    assert [job["id"] for job in jobs.jobs()] == [done["id"]]


def test_an_input_image_reaches_the_replica(routed, direct, tmp_path):
    jobs = routed("sd-i2i").jobs
    data = input_image(3)
    upload = store_image(data, "image", jobs.uploads, ServerSettings())
    asked = {"workflow": "sd-i2i", "prompt": "a fox", "steps": 2, "seed": 4, "inputs": {"strength": 0.6}}
    done = finished(jobs.describe, jobs.submit(asked, {"image": upload})["id"])
    assert done["state"] == "done", done["error"]
    local = tmp_path / "input.png"
    local.write_bytes(data)
    assert results(jobs, done["id"]) == direct(asked, {"image": local})


# -- refused requests -----------------------------------------------------------------------------

BAD = {
    "unknown workflow": request("nope"),
    "too many steps": request(steps=10_000),
    "bad size": request(size="big"),
    "unknown key": request(colour="red"),
    "unknown input": request(inputs={"no_such_input": 1}),
    "not a table": ["a", "list"],
}


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_a_bad_request_gets_the_single_machine_servers_error(routed, workflows, bad):
    one = routed()
    served = ServedWorkflows([workflows["sd"], workflows["flux"]], ComponentsManager())
    scheduler = Scheduler(served)  # never started: it only checks
    try:
        with pytest.raises(Exception) as single:
            scheduler.submit(bad)
    finally:
        scheduler.close()
    with pytest.raises(type(single.value)) as ingress:
        one.jobs.submit(bad)
    assert type(ingress.value) is type(single.value) and str(ingress.value) == str(single.value)
    assert one.jobs.jobs() == []  # nothing is kept ...
    assert all(replica.scheduler.jobs() == [] for replica in one.replicas.values())  # ... nor sent


def test_a_full_queue_is_refused_as_the_http_layer_answers_429(routed):
    jobs = routed(max_queue=2).jobs
    jobs.pause()
    first = [jobs.submit(request(seed=seed))["id"] for seed in (1, 2)]
    with pytest.raises(QueueFullError) as full:
        jobs.submit(request(seed=3))
    assert full.value.max_queue == 2 and full.value.retry_after >= 1
    jobs.cancel(first[0])  # a finished job frees its place
    jobs.submit(request(seed=3))


@pytest.mark.parametrize(("name", "value"), [("tries", 0), ("max_queue", 0), ("tries", True)])
def test_bad_counts_are_refused(routed, name, value):
    one = routed()
    with pytest.raises(ValueError, match=name):
        RoutedJobs(one.jobs.served, one.workers, **{name: value})


# -- cancel ---------------------------------------------------------------------------------------


def test_a_job_held_at_the_ingress_is_cancelled_at_once(routed):
    jobs = routed().jobs
    jobs.pause()
    job = jobs.submit(request())
    cancelled = jobs.cancel(job["id"])
    assert cancelled["state"] == "cancelled" and cancelled["error"] == "cancelled by a client"
    assert kinds(jobs, job["id"]) == ["queued", "cancelled"]
    jobs.resume()
    time.sleep(0.3)  # a resumed ingress must not send it after all
    assert jobs.describe(job["id"])["state"] == "cancelled" and jobs.describe(job["id"])["replica"] is None


def test_a_job_waiting_on_a_replica_is_cancelled_there(routed):
    one = routed()
    for replica in one.replicas.values():
        replica.scheduler.pause()  # the replicas hold it, not the ingress
    job = one.jobs.submit(request())
    wait_until(lambda: one.jobs.describe(job["id"])["replica"] is not None, "the job was assigned")
    replica = one.replicas[one.jobs.describe(job["id"])["replica"]]
    one.jobs.cancel(job["id"])
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "cancelled" and done["error"] == "cancelled by a client", done
    assert [described["state"] for described in replica.scheduler.jobs()] == ["cancelled"]
    with pytest.raises(JobStateError):
        one.jobs.cancel(job["id"])


def test_a_running_job_is_cancelled_on_its_replica_and_makes_no_result(routed):
    one = routed(hold=("r1", "r2"))
    job = one.jobs.submit(request())
    replica = None
    deadline = time.monotonic() + WAIT
    while replica is None:
        replica = next((name for name, hub in one.hubs.items() if hub.held.is_set()), None)
        assert time.monotonic() < deadline, "no replica reached a step"
        time.sleep(0.02)
    wait_until(lambda: one.jobs.describe(job["id"])["state"] == "running", "the job is running")
    assert one.jobs.describe(job["id"])["replica"] == replica
    one.jobs.cancel(job["id"])
    one.hubs[replica].release.set()
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "cancelled" and done["results"] == [], done
    assert kinds(one.jobs, job["id"]).count("cancelled") == 1
    assert list(one.jobs.results.glob("*")) == []


def test_an_unknown_or_finished_job_cannot_be_cancelled(routed):
    jobs = routed().jobs
    with pytest.raises(UnknownJobError):
        jobs.cancel("no-such-job")
    with pytest.raises(UnknownJobError):
        jobs.describe("r1:no-such-job")
    job = jobs.submit(request())
    assert finished(jobs.describe, job["id"])["state"] == "done"
    with pytest.raises(JobStateError, match="done"):
        jobs.cancel(job["id"])


# -- pause ----------------------------------------------------------------------------------------


def test_pause_holds_jobs_and_pauses_every_replica_until_resume(routed, direct):
    one = routed()
    one.jobs.pause()
    assert one.jobs.queue()["paused"] is True
    assert all(replica.scheduler.paused for replica in one.replicas.values())
    job = one.jobs.submit(request(seed=4))
    time.sleep(0.5)  # long enough for a job to start, were it sent
    described = one.jobs.describe(job["id"])
    assert described["state"] == "queued" and described["replica"] is None
    assert one.jobs.queue()["waiting"] == [job["id"]]
    assert all(replica.scheduler.jobs() == [] for replica in one.replicas.values())
    one.jobs.resume()
    assert not any(replica.scheduler.paused for replica in one.replicas.values())
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "done", done["error"]
    assert results(one.jobs, job["id"]) == direct(request(seed=4))
    assert one.jobs.queue()["paused"] is False


# -- retries ----------------------------------------------------------------------------------------


def lose_mid_job(one: Any, job_id: str, release_others: bool = True) -> str:
    """Lose the replica that holds ``job_id`` at its first step; its id. The others run the next try
    without a hold (``release_others``), or hold it too."""
    deadline = time.monotonic() + WAIT
    while not any(hub.held.is_set() for hub in one.hubs.values()):
        assert time.monotonic() < deadline, "no replica reached a step"
        time.sleep(0.02)
    lost = next(name for name, hub in one.hubs.items() if hub.held.is_set())
    wait_until(lambda: one.jobs.describe(job_id)["replica"] == lost, "the ingress saw the job's replica")
    for name, hub in one.hubs.items():
        if name != lost and release_others:
            hub.release.set()  # the other replica runs its try without a hold
    # ``lose`` closes the replica, which waits for its worker: the worker is let go once the loss is marked
    losing = threading.Thread(target=one.workers.lose, args=(lost,))
    losing.start()
    wait_until(lambda: lost not in one.workers.replicas(), "the replica was marked lost")
    one.hubs[lost].release.set()
    losing.join(WAIT)
    assert not losing.is_alive()
    return lost


def test_a_job_whose_replica_is_lost_runs_again_on_the_other_and_ends_once(routed, direct):
    one = routed(hold=("r1", "r2"))
    job = one.jobs.submit(request(seed=5))
    lost = lose_mid_job(one, job["id"])
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "done", done["error"]
    assert done["replica"] not in (None, lost) and done["attempts"] == 2
    assert done["results"] == [f"{job['id']}-0.png"]  # one result, made once
    assert results(one.jobs, job["id"]) == direct(request(seed=5))
    events = one.jobs.events.history(job["id"])
    happened = [event["kind"] for event in events]
    assert happened.count("started") == 2 and happened.count("done") == 1
    assert [event["kind"] for event in events if event["kind"] in FINAL_KINDS] == ["done"]
    assert [event["replica"] for event in events if event["kind"] == "assigned"] == [lost, done["replica"]]
    assert [event["attempt"] for event in events if event["kind"] == "started"] == [1, 2]
    retrying = [event for event in events if event["kind"] == "retrying"]
    assert len(retrying) == 1 and retrying[0]["replica"] == lost and lost in retrying[0]["reason"]
    # the order: a try starts, is lost, the next one starts and ends
    assert happened.index("retrying") < happened.index("started", happened.index("started") + 1)
    assert happened[-1] == "done"


def test_with_one_try_a_job_whose_replica_is_lost_fails_naming_it(routed):
    one = routed(hold=("r1", "r2"), tries=1)
    job = one.jobs.submit(request(seed=6))
    lost = lose_mid_job(one, job["id"])
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "failed" and done["results"] == [], done
    assert f"replica {lost} was lost" in done["error"] and "tried 1 time" in done["error"], done["error"]
    happened = kinds(one.jobs, job["id"])
    assert happened.count("failed") == 1 and happened[-1] == "failed"
    assert "retrying" not in happened  # nothing was tried again
    assert happened.count("started") == 1
    failed = one.jobs.events.history(job["id"])[-1]
    assert lost in failed["error"]


def test_a_job_cancelled_between_two_tries_is_not_tried_again(routed):
    one = routed(hold=("r1", "r2"))
    job = one.jobs.submit(request(seed=5))
    lost = lose_mid_job(one, job["id"], release_others=False)
    wait_until(lambda: "retrying" in kinds(one.jobs, job["id"]), "the job is to be tried again")
    one.jobs.cancel(job["id"])
    for hub in one.hubs.values():
        hub.release.set()
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "cancelled" and done["results"] == [], done
    assert kinds(one.jobs, job["id"]).count("cancelled") == 1
    other = next(name for name in one.replicas if name != lost)
    for described in one.replicas[other].scheduler.jobs():  # a try sent before the cancel is cancelled too
        assert finished(one.replicas[other].scheduler.describe, described["id"])["state"] == "cancelled"


def test_a_job_that_fails_on_its_replica_is_not_tried_again(routed):
    one = routed()
    job = one.jobs.submit(request(timeout=0.01))  # over before the pipeline has loaded
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "failed" and done["error"] == "timed out after 0.01 s", done
    assert done["attempts"] == 1 and "retrying" not in kinds(one.jobs, job["id"])


def test_a_replica_too_small_for_a_workflow_passes_it_on_and_is_not_chosen_again(routed, direct, sizes):
    # r1's device holds none of sd's models; r2's holds them all. Equal queues: a new job goes to r1 first.
    one = routed("sd", budgets=(1000, max(sizes.values())))
    job = one.jobs.submit(request(seed=8))
    done = finished(one.jobs.describe, job["id"])
    assert done["state"] == "done", done["error"]
    assert done["replica"] == "r2" and done["attempts"] == 2
    assert results(one.jobs, job["id"]) == direct(request(seed=8))
    events = one.jobs.events.history(job["id"])
    assert [event["replica"] for event in events if event["kind"] == "assigned"] == ["r1", "r2"]
    retrying = [event for event in events if event["kind"] == "retrying"]
    assert len(retrying) == 1 and "could not load sd" in retrying[0]["reason"]
    assert [event["kind"] for event in events if event["kind"] in FINAL_KINDS] == ["done"]
    assert one.replicas["r1"].record_routing_stats()["unloadable"] == ["sd"]
    again = finished(one.jobs.describe, one.jobs.submit(request(seed=9))["id"])
    assert again["state"] == "done" and again["replica"] == "r2" and again["attempts"] == 1
    assert len(one.replicas["r1"].scheduler.jobs()) == 1  # the first try only


def test_a_workflow_no_replica_can_load_fails_after_its_tries(routed):
    one = routed("sd", budgets=(1000, 1000), tries=2)
    done = finished(one.jobs.describe, one.jobs.submit(request())["id"])
    assert done["state"] == "failed" and "could not load sd" in done["error"], done
    assert "tried 2 times, on replicas r1, r2" in done["error"], done["error"]


# -- events, close, threads -----------------------------------------------------------------------


def test_events_stream_in_order_to_a_listener(routed):
    jobs = routed().jobs
    with jobs.events.subscribe() as listener:
        job = jobs.submit(request(steps=3))
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + WAIT
        while not events or events[-1]["kind"] not in FINAL_KINDS:
            assert time.monotonic() < deadline, f"no final event: {events}"
            event = listener.get(timeout=0.1)
            if event is not None and event["job"] == job["id"]:
                events.append(event)
    seqs = [event["seq"] for event in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    happened = [event["kind"] for event in events if event["kind"] != "position"]  # the replica's place
    assert happened[:3] == ["queued", "assigned", "started"] and happened[-1] == "done", happened
    steps = [event["step"] for event in events if event["kind"] == "step"]
    assert steps == sorted(steps) and len(steps) >= 3
    assert all(event["replica"] == events[1]["replica"] for event in events[1:])
    assert events[-1]["results"] == jobs.describe(job["id"])["results"]
    assert jobs.events.history(job["id"])[-1] == events[-1]  # a later listener gets the same end


def test_close_with_jobs_in_flight_cancels_them_on_their_replicas(routed):
    one = routed(hold=("r1", "r2"))
    running = one.jobs.submit(request(seed=1))
    waiting = one.jobs.submit(request(seed=2))
    deadline = time.monotonic() + WAIT
    while not any(hub.held.is_set() for hub in one.hubs.values()):
        assert time.monotonic() < deadline, "no replica reached a step"
        time.sleep(0.02)
    wait_until(
        lambda: sum(len(replica.scheduler.jobs()) for replica in one.replicas.values()) == 2,
        "both jobs reached a replica",
    )
    started = time.monotonic()
    one.jobs.close()
    assert time.monotonic() - started < WAIT
    for hub in one.hubs.values():
        hub.release.set()
    for replica in one.replicas.values():  # no replica goes on with a job no one listens to
        for described in replica.scheduler.jobs():
            assert finished(replica.scheduler.describe, described["id"])["state"] == "cancelled", described
    for job in (running, waiting):  # and no listener waits for ever
        closed = one.jobs.describe(job["id"])
        assert closed["state"] == "cancelled" and "closed" in closed["error"], closed
        assert one.jobs.events.history(job["id"])[-1]["kind"] == "cancelled"
    with pytest.raises(RuntimeError, match="closed"):
        one.jobs.submit(request())
    one.jobs.close()  # again: nothing


def test_two_threads_submitting_at_once_each_get_their_jobs(routed, direct):
    jobs = routed().jobs
    jobs.pause()  # all in before any runs
    barrier = threading.Barrier(2)

    def submit(first_seed: int) -> list[str]:
        barrier.wait(WAIT)
        workflow = "sd" if first_seed < 10 else "flux"
        return [jobs.submit(request(workflow, seed=first_seed + n))["id"] for n in range(3)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ids = [pool.submit(submit, seed) for seed in (0, 10)]
        submitted = [future.result(WAIT) for future in ids]
    every = [job_id for ids_ in submitted for job_id in ids_]
    assert len(set(every)) == 6
    described = jobs.jobs()
    assert sorted(job["id"] for job in described) == sorted(every)
    jobs.resume()
    for thread_ids, workflow, first in zip(submitted, ("sd", "flux"), (0, 10), strict=True):
        for n, job_id in enumerate(thread_ids):
            done = finished(jobs.describe, job_id)
            assert done["state"] == "done", done["error"]
            assert done["seeds"] == [first + n] and done["workflow"] == workflow
    assert results(jobs, submitted[0][0]) == direct(request("sd", seed=0))
    assert results(jobs, submitted[1][0]) == direct(request("flux", seed=10))


def test_the_queue_names_each_replicas_jobs(routed):
    one = routed(hold=("r1", "r2"))
    job = one.jobs.submit(request())
    wait_until(lambda: one.jobs.describe(job["id"])["state"] == "running", "the job is running")
    queue = one.jobs.queue()
    replica = one.jobs.describe(job["id"])["replica"]
    assert queue["running"] == job["id"] and queue["running_all"] == [job["id"]]
    assert queue["replicas"] == {name: [job["id"]] if name == replica else [] for name in ("r1", "r2")}
    assert queue["max_queue"] == 100 and queue["paused"] is False


def test_the_manager_and_memory_answer_for_each_replica(routed):
    jobs = routed().jobs
    assert finished(jobs.describe, jobs.submit(request())["id"])["state"] == "done"
    components = jobs.components()
    replica = jobs.jobs()[0]["replica"]
    assert {component["replica"] for component in components} == {"r1", "r2"}  # made from configs: both
    unets = [component for component in components if component["id"].startswith("unet_")]
    assert [component["replica"] for component in unets] == [replica]  # loaded: where the job ran
    text = jobs.manager_text()
    assert "replica r1\n" in text and "replica r2\n" in text
    memory = jobs.memory()
    assert set(memory["replicas"]) == {"r1", "r2"}
    assert {device["device"].split("/")[0] for device in memory["devices"]} == {"r1", "r2"}


def test_the_ingress_checks_its_own_limits(routed):
    one = routed(limits=Limits(max_steps=3))
    with pytest.raises(RequestError, match="at most 3"):
        one.jobs.submit(request(steps=4))
    assert all(replica.scheduler.jobs() == [] for replica in one.replicas.values())


def test_with_every_replica_lost_a_job_fails_saying_so(routed):
    one = routed(tries=2)
    for replica in ("r1", "r2"):
        one.workers.lose(replica)
    done = finished(one.jobs.describe, one.jobs.submit(request())["id"])
    assert done["state"] == "failed" and done["replica"] is None, done
    assert done["error"].startswith("no replica took it: ReplicaLostError: every replica is lost"), done
    assert "tried 2 times, on replicas none" in done["error"]
    assert one.jobs.queue()["replicas"] == {} and one.jobs.manager_text() == ""
