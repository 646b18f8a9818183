"""Reports of what a replica holds and the ranking of replicas by the bytes each would move for a job."""

from __future__ import annotations

import pytest

from modular.serving import ResidencyReport, rank_replicas, workflow_needs

from .conftest import SMALL, fail_loading

NEEDS = {"te": 100, "unet": 1000, "vae": 200}


def test_a_replica_is_charged_what_it_lacks_and_what_it_holds_off_the_device():
    report = ResidencyReport(missing={"te": 0, "unet": 1000})  # unet on its host, vae not held
    assert report.bytes_for(NEEDS) == 0 + 1000 + 200


def test_replicas_rank_by_bytes_then_queue():
    reports = {
        "holds-all": ResidencyReport(missing={"te": 0, "unet": 0, "vae": 0}, queued=3),
        "empty-idle": ResidencyReport(queued=0),
        "empty-busy": ResidencyReport(queued=2),
        "holds-unet": ResidencyReport(missing={"unet": 0}, queued=1),
    }
    assert rank_replicas(reports, NEEDS, imbalance=3) == [
        ["holds-all"],
        ["holds-unet"],
        ["empty-idle", "empty-busy"],
    ]


def test_queues_out_of_balance_rank_by_queue_length():
    reports = {
        "holds-all": ResidencyReport(missing={"te": 0, "unet": 0, "vae": 0}, queued=12),
        "empty": ResidencyReport(),
    }
    assert rank_replicas(reports, NEEDS, imbalance=8) == [["empty"], ["holds-all"]]
    assert rank_replicas(reports, NEEDS, imbalance=12) == [["holds-all"], ["empty"]]


def test_a_replica_that_could_not_load_the_workflow_comes_last():
    reports = {
        "failed": ResidencyReport(missing={"te": 0}, unloadable=("sd",)),
        "other": ResidencyReport(queued=5),
    }
    assert rank_replicas(reports, NEEDS, workflow="sd") == [["other"], ["failed"]]
    assert rank_replicas(reports, NEEDS, workflow="flux") == [["failed"], ["other"]]


def test_a_replica_waits_within_imbalance_of_the_shortest_rank_by_bytes_and_the_others_by_wait():
    reports = {
        "holds-all": ResidencyReport(missing={"te": 0, "unet": 0, "vae": 0}, queued=9),
        "holds-unet": ResidencyReport(missing={"unet": 0}),
        "empty": ResidencyReport(),
        "empty-busy": ResidencyReport(),
    }
    waits = {"holds-all": 2.5, "holds-unet": 1.5, "empty": 0.5, "empty-busy": 3.0}  # not the reports' queues
    assert rank_replicas(reports, NEEDS, imbalance=1, waits=waits) == [
        ["holds-unet"],
        ["empty"],
        ["holds-all"],
        ["empty-busy"],
    ]
    assert rank_replicas(reports, NEEDS, imbalance=2.0, waits=waits) == [
        ["holds-all"],
        ["holds-unet"],
        ["empty"],
        ["empty-busy"],
    ]


@pytest.mark.parametrize("imbalance", [-1, -0.5, float("nan"), True, "8", None])
def test_a_bad_imbalance_is_refused(imbalance):
    with pytest.raises(ValueError, match="imbalance must be a number of job times"):
        rank_replicas({}, NEEDS, imbalance=imbalance)


def test_a_report_crosses_processes_as_json_values():
    report = ResidencyReport(
        missing={"a|b|null|null": 5},
        queued=2,
        unloadable=["sd"],
        seconds={"sd": 0.5},
        streamed={"h:1": 1},
        seconds_per_byte=1e-9,
    )
    assert ResidencyReport.from_dict(report.as_dict()) == report
    assert ResidencyReport.from_dict({}) == ResidencyReport()


def test_a_replica_that_ran_a_family_is_ranked_first_for_it(make_scheduler, sizes):
    budget = max(sizes["sd"], sizes["flux"])  # each replica's device holds one family
    replicas = {
        "a": make_scheduler("sd", "flux", budget=budget),
        "b": make_scheduler("sd", "flux", budget=budget),
    }
    for name, workflow in (("a", "sd"), ("b", "flux")):
        job = replicas[name].submit({**SMALL, "workflow": workflow, "seed": 1})
        assert replicas[name].run_next() is job and job.state == "done", job.error
    reports = {name: scheduler.residency_report() for name, scheduler in replicas.items()}
    for workflow, holder in (("sd", "a"), ("flux", "b")):
        scheduler = replicas[holder]
        needs = workflow_needs(scheduler.manager, scheduler.served.pipeline(workflow))
        assert needs and all(size > 0 for size in needs.values())
        assert reports[holder].bytes_for(needs) == 0  # its models are on the holder's device
        assert rank_replicas(reports, needs, workflow)[0] == [holder]


def test_the_report_carries_what_each_job_moved_and_ran(make_scheduler, sizes):
    scheduler = make_scheduler("sd", budget=sizes["sd"])
    for seed in (1, 2):
        job = scheduler.submit({**SMALL, "workflow": "sd", "seed": seed})
        assert scheduler.run_next() is job and job.state == "done", job.error
    log = scheduler.manager.offload_log
    assert log is not None and log.total_bytes_to_device > 0
    assert scheduler.job_times.moved("sd") == [log.total_bytes_to_device, 0]  # the first job moved it all
    report = scheduler.residency_report()
    assert set(report.seconds) == {"sd"} and report.seconds["sd"] > 0
    assert report.seconds_per_byte == scheduler.job_times.seconds_per_byte()


def test_a_preload_reports_a_workflow_that_does_not_fit_unloadable(make_scheduler, monkeypatch):
    scheduler = make_scheduler("sd", "flux")
    fail_loading(monkeypatch, scheduler, "flux", MemoryError("no room to load flux"))
    scheduler.preload()
    report = scheduler.residency_report()
    assert report.unloadable == ("flux",) and report.missing  # sd's models are held


def test_a_workflow_that_ran_out_of_memory_loading_is_reported_unloadable(make_scheduler, monkeypatch):
    scheduler = make_scheduler("sd", "flux")

    def no_room(name, on_cuda=False):
        raise MemoryError(f"no room to load {name}")

    monkeypatch.setattr(scheduler.served, "load", no_room)
    job = scheduler.submit({**SMALL, "workflow": "flux", "seed": 1})
    assert scheduler.run_next() is job and job.state == "failed"
    report = scheduler.residency_report()
    assert report.unloadable == ("flux",)
    assert rank_replicas({"here": report, "there": ResidencyReport(queued=3)}, {}, "flux") == [
        ["there"],
        ["here"],
    ]
