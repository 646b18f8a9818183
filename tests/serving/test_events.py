"""The event hub: bounded listeners that drop their oldest events, a job's history replayed to a late
listener, bounded history, listeners gone once closed; and the events a scheduler's job publishes."""

from __future__ import annotations

import base64
import io
import sys
import threading

import PIL.Image
import pytest

from modular.serving import EventHub

from .conftest import SMALL, drain, results


def _all(listener):
    events = []
    while (event := listener.get(timeout=0)) is not None:
        events.append(event)
    return events


def test_a_listener_that_falls_behind_drops_its_oldest_and_keeps_the_final_event():
    hub = EventHub(listener_size=3)
    with hub.subscribe("a") as listener:
        for step in range(1, 9):
            hub.publish("step", "a", step=step, total=8)
        hub.publish("done", "a", results=["a-0.png"])
        events = _all(listener)
    assert [(event["kind"], event.get("step")) for event in events] == [
        ("step", 7),
        ("step", 8),
        ("done", None),
    ]
    assert listener.dropped == 6
    assert events[-1]["results"] == ["a-0.png"]


def test_a_late_listener_gets_the_job_s_history_with_the_latest_step_and_preview_only():
    hub = EventHub()
    hub.publish("queued", "a", workflow="sd")
    hub.publish("started", "a")
    for step in (1, 2, 3):
        hub.publish("block", "a", block=f"b{step}")
        hub.publish("step", "a", step=step, total=3)
        hub.publish("preview", "a", step=step, png="...")
    hub.publish("queued", "b", workflow="sd")  # another job's: not replayed
    with hub.subscribe("a") as listener:
        replayed = _all(listener)
        hub.publish("done", "a", results=[])
        hub.publish("done", "b", results=[])
        later = _all(listener)
    assert [(event["kind"], event.get("step", event.get("block"))) for event in replayed] == [
        ("queued", None),
        ("started", None),
        ("block", "b3"),
        ("step", 3),
        ("preview", 3),
    ]
    assert [event["seq"] for event in replayed] == sorted(event["seq"] for event in replayed)
    assert [(event["kind"], event["job"]) for event in later] == [("done", "a")]


def test_a_job_listener_hears_only_its_job_and_the_queue_listener_hears_all():
    hub = EventHub()
    with hub.subscribe("a") as job, hub.subscribe() as queue:
        hub.publish("queued", "a")
        hub.publish("queued", "b")
        hub.publish("paused")
        assert [(event["kind"], event["job"]) for event in _all(job)] == [("queued", "a")]
        assert [(event["kind"], event["job"]) for event in _all(queue)] == [
            ("queued", "a"),
            ("queued", "b"),
            ("paused", None),
        ]


def test_a_closed_listener_is_unsubscribed_and_hears_nothing_more():
    hub = EventHub()
    listeners = [hub.subscribe("a"), hub.subscribe("a"), hub.subscribe(), hub.subscribe("b")]
    assert hub.listener_count() == 4
    listeners[0].close()
    hub.publish("step", "a", step=1)
    assert listeners[0].get(timeout=0) is None
    assert listeners[1].get(timeout=0)["kind"] == "step"
    for listener in listeners[1:]:
        with listener:
            pass
    assert hub.listener_count() == 0
    listeners[0].close()  # closing twice is harmless
    assert hub.listener_count() == 0


def test_history_is_kept_for_the_latest_keep_jobs_jobs():
    hub = EventHub(keep_jobs=2)
    for job in ("a", "b", "c"):
        hub.publish("queued", job)
    assert hub.history("a") == []
    assert [event["job"] for event in hub.history("b") + hub.history("c")] == ["b", "c"]
    hub.publish("step", "b", step=1)  # b is now the latest; c the oldest kept
    hub.publish("queued", "d")
    assert hub.history("c") == [] and len(hub.history("b")) == 2
    with hub.subscribe("a") as late:
        assert late.get(timeout=0) is None


@pytest.mark.parametrize(
    ("field", "value"), [("listener_size", 0), ("listener_size", -1), ("keep_jobs", 0), ("keep_jobs", 2.5)]
)
def test_the_hub_refuses_sizes_that_are_not_bounds(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be a whole number of at least 1 \(got {value}\)$"):
        EventHub(**{field: value})


def test_every_listener_gets_events_in_publishing_order_from_many_threads():
    """Eight threads publish at once (the worker, submitters, cancels do): each listener sees seq rising."""
    hub = EventHub(listener_size=10_000)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        with hub.subscribe() as queue, hub.subscribe("job-0") as job:

            def publish(number):
                for step in range(400):
                    hub.publish("step", f"job-{number}", step=step)

            threads = [threading.Thread(target=publish, args=(number,)) for number in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            for listener, count in ((queue, 3200), (job, 400)):
                seqs = [event["seq"] for event in _all(listener)]
                assert len(seqs) == count
                assert seqs == sorted(seqs)
    finally:
        sys.setswitchinterval(interval)


# -- a scheduler's events ----------------------------------------------------------------------------------
def test_a_job_s_events_from_queued_to_done(make_scheduler):
    scheduler = make_scheduler("sd")
    with scheduler.events.subscribe() as queue:
        job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
        drain(scheduler)
        events = [event for event in _all(queue) if event["job"] == job.id]
    kinds = [event["kind"] for event in events]
    assert kinds[:3] == ["queued", "position", "started"]
    assert kinds[-1] == "done" and kinds.count("done") == 1
    steps = [event for event in events if event["kind"] == "step"]
    assert [event["step"] for event in steps] == list(range(1, steps[0]["total"] + 1))
    assert "block" in kinds
    assert events[0]["seeds"] == [1] and events[-1]["results"] == [f"{job.id}-0.png"]
    assert [event["seq"] for event in events] == sorted(event["seq"] for event in events)


@pytest.mark.parametrize("workflow", ["sd", "zimage"])
def test_previews_are_pngs_of_the_requested_size(make_scheduler, workflow):
    scheduler = make_scheduler(workflow, preview_every=1)
    job = scheduler.submit({**SMALL, "workflow": workflow, "seed": 1})
    with scheduler.events.subscribe(job.id) as listener:
        drain(scheduler)
        previews = [event for event in _all(listener) if event["kind"] == "preview"]
    assert previews and scheduler.describe(job.id)["state"] == "done"
    image = PIL.Image.open(io.BytesIO(base64.b64decode(previews[-1]["png"])))
    assert image.format == "PNG" and image.size[0] > 0


def test_a_late_listener_of_a_finished_job_gets_its_replay_ending_with_the_final_event(make_scheduler):
    scheduler = make_scheduler("sd", preview_every=1)
    job = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1})
    drain(scheduler)
    with scheduler.events.subscribe(job.id) as late:
        replayed = _all(late)
    kinds = [event["kind"] for event in replayed]
    assert kinds[0] == "queued" and kinds[-1] == "done"
    assert kinds.count("step") <= 1 and kinds.count("preview") <= 1
    assert scheduler.events.listener_count() == 0


def test_a_family_without_previews_runs_without_them(make_scheduler, direct, caplog):
    """The tiny Flux repo's latents have no latent-to-RGB map: its jobs run, without preview events."""
    scheduler = make_scheduler("flux", preview_every=1)
    request = {**SMALL, "workflow": "flux", "seed": 1}
    jobs = [scheduler.submit(request), scheduler.submit({**request, "seed": 2})]
    with scheduler.events.subscribe() as listener, caplog.at_level("INFO", "modular.serving.scheduler"):
        drain(scheduler)
        kinds = [event["kind"] for event in _all(listener)]
    assert "preview" not in kinds and kinds.count("done") == 2
    assert [record.getMessage().startswith("flux makes no previews") for record in caplog.records].count(
        True
    ) == 1
    assert results(scheduler, jobs[0].id) == direct(request)
