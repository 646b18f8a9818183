"""Prefetch: while a job runs, the next job's pipeline loads to the host and, where the device has free room,
its models are placed (``OffloadEngine.place_if_room``); with no room nothing is evicted, and the running
job's results never change."""

from __future__ import annotations

import pytest

from components import ComponentsManager
from offload import OffloadEngine, SimulatedDevice
from tests.offload.helpers import call, sized

from .conftest import SMALL, WAIT, drain, fail_loading, results

S = 4000  # bytes of each model of the engine tests


# -- OffloadEngine.place_if_room ---------------------------------------------------------------------------
def _engine(budget: int, margin: int = 0) -> tuple[OffloadEngine, dict]:
    models = {"a": sized(S), "b": sized(S)}
    engine = OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=margin)
    for name, module in models.items():
        engine.attach(name, module)
    return engine, models


def test_place_if_room_places_a_model_that_fits():
    engine, models = _engine(2 * S)
    expected = call(models["a"])
    assert engine.place_if_room("a") is True
    assert engine.is_resident("a") and not engine.is_resident("b")
    assert [(d.model_id, d.reason) for d in engine.log] == [("a", "fits")]
    assert engine.place_if_room("a") is True and len(engine.log) == 1  # already there: nothing moves
    assert call(models["a"]).equal(expected) and len(engine.log) == 1


def test_place_if_room_without_room_places_nothing_and_evicts_nothing():
    engine, models = _engine(S)
    call(models["a"])
    log = [(d.model_id, d.reason) for d in engine.log]
    assert engine.place_if_room("b") is False
    assert engine.is_resident("a") and not engine.is_resident("b")
    assert [(d.model_id, d.reason) for d in engine.log] == log == [("a", "fits")]


def test_place_if_room_keeps_the_margin_free():
    engine, _ = _engine(2 * S, margin=1)
    assert engine.place_if_room("a") is True
    assert engine.place_if_room("b") is False  # S bytes free, but one of them is the margin's


def test_place_if_room_of_a_model_not_attached_is_a_key_error():
    engine, _ = _engine(2 * S)
    with pytest.raises(KeyError, match="'c' is not attached to this engine"):
        engine.place_if_room("c")


# -- the scheduler's prefetch ------------------------------------------------------------------------------
def _models(scheduler, workflow):
    pipe = scheduler.served.pipeline(workflow)
    return [
        scheduler.manager.get_id(getattr(pipe, name))
        for name in pipe.pretrained_component_names
        if hasattr(getattr(pipe, name, None), "parameters")
    ]


def _engine_of(scheduler):
    (engine,) = scheduler.manager.offload_engines
    return engine


@pytest.mark.parametrize("submitted", ["before", "while-running"])
def test_while_a_job_runs_the_next_job_s_pipeline_loads_and_its_models_go_where_there_is_room(
    make_scheduler, direct, sizes, hub, submitted
):
    """The next job is prefetched whether it waited when the running job started or came while it ran."""
    scheduler = make_scheduler("sd", "flux", budget=sizes["sd"] + sizes["flux"], events=hub)
    first = {**SMALL, "workflow": "sd", "seed": 1, "priority": 1}
    second = {**SMALL, "workflow": "flux", "seed": 2}
    running = scheduler.submit(first)
    upcoming = scheduler.submit(second) if submitted == "before" else None
    hub.job = running.id
    scheduler.start()
    assert hub.reached.wait(WAIT)
    if upcoming is None:
        upcoming = scheduler.submit(second)
    scheduler.wait_prefetch(WAIT)
    assert scheduler.running is running and scheduler.describe(upcoming.id)["state"] == "queued"
    assert scheduler.served.is_loaded("flux")
    engine = _engine_of(scheduler)
    assert all(engine.is_resident(model) for model in _models(scheduler, "flux"))
    assert scheduler.cost("flux") == 0
    hub.release.set()
    assert scheduler.wait_idle(WAIT)
    assert results(scheduler, running.id) == direct(first)
    assert results(scheduler, upcoming.id) == direct(second)


def test_without_room_prefetch_loads_to_the_host_and_evicts_nothing(make_scheduler, direct, sizes):
    """SD fills the device; while an SD job runs, Flux's pipeline loads but none of its models is placed,
    and no SD model leaves: the SD job moves nothing and equals the direct call, as does the Flux job."""
    scheduler = make_scheduler("sd", "flux", budget=sizes["sd"])
    scheduler.submit({**SMALL, "workflow": "sd", "seed": 0})
    drain(scheduler)
    engine = _engine_of(scheduler)
    assert all(engine.is_resident(model) for model in _models(scheduler, "sd"))
    flux, sd = {**SMALL, "workflow": "flux", "seed": 2}, {**SMALL, "workflow": "sd", "seed": 1}
    flux_job, sd_job = scheduler.submit(flux), scheduler.submit(sd)
    log = len(engine.log)
    assert scheduler.run_next() is sd_job  # nothing to bring: it goes first
    scheduler.wait_prefetch(WAIT)
    assert scheduler.served.is_loaded("flux")
    assert len(engine.log) == log  # no placement, no eviction, no shrink
    assert all(engine.is_resident(model) for model in _models(scheduler, "sd"))
    assert not any(engine.is_resident(model) for model in _models(scheduler, "flux"))
    assert results(scheduler, sd_job.id) == direct(sd)
    assert drain(scheduler) == [flux_job.id]
    assert results(scheduler, flux_job.id) == direct(flux)


def test_prefetch_off_loads_nothing_ahead(make_scheduler, sizes):
    scheduler = make_scheduler("sd", "flux", budget=sizes["sd"] + sizes["flux"], prefetch=False)
    sd = scheduler.submit({**SMALL, "workflow": "sd", "seed": 1, "priority": 1})
    flux = scheduler.submit({**SMALL, "workflow": "flux", "seed": 2})
    assert scheduler.run_next() is sd
    scheduler.wait_prefetch(WAIT)
    assert not scheduler.served.is_loaded("flux")
    assert scheduler.describe(flux.id)["state"] == "queued"
    engine = _engine_of(scheduler)
    assert engine.attached_ids() == _models(scheduler, "sd")


def test_a_prefetch_that_fails_leaves_the_running_job_alone_and_the_job_reports_it(
    make_scheduler, direct, monkeypatch
):
    scheduler = make_scheduler("sd", "flux")
    fail_loading(monkeypatch, scheduler, "flux", OSError("flux weights unreadable"))
    request = {**SMALL, "workflow": "sd", "seed": 1}
    sd = scheduler.submit(request)
    flux = scheduler.submit({**SMALL, "workflow": "flux", "seed": 2, "priority": -1})
    assert drain(scheduler) == [sd.id, flux.id]
    assert results(scheduler, sd.id) == direct(request)
    described = scheduler.describe(flux.id)
    assert (described["state"], described["error"]) == ("failed", "OSError: flux weights unreadable")


def test_without_offload_prefetch_loads_the_pipeline_only(make_scheduler, direct):
    scheduler = make_scheduler("sd", "zimage")
    first = {**SMALL, "workflow": "sd", "seed": 1, "priority": 1}
    second = {**SMALL, "workflow": "zimage", "seed": 2}
    jobs = [scheduler.submit(first), scheduler.submit(second)]
    assert scheduler.run_next() is jobs[0]
    scheduler.wait_prefetch(WAIT)
    assert scheduler.served.is_loaded("zimage") and scheduler.manager.offload_engines == []
    assert scheduler.cost("zimage") == 0
    drain(scheduler)
    assert [results(scheduler, job.id) for job in jobs] == [direct(first), direct(second)]


def test_a_separate_manager_is_untouched(make_scheduler):
    """The direct calls' managers share nothing with the scheduler's (a check of the fixtures)."""
    scheduler = make_scheduler("sd")
    assert scheduler.manager is not ComponentsManager()
