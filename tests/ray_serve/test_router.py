"""The residency router's ranking, on stand-ins for Ray's replicas and requests (no cluster). Skipped where
Ray Serve is not installed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')

from modular.ray_serve.router import ResidencyRouter, router_kwargs
from modular.ray_serve.worker import request_workflow
from modular.serving import ResidencyReport

NEEDS = {"sd": {"te": 100, "unet": 1000}, "flux": {"dit": 3000}}


def replica(name, report=None):
    """A stand-in for Ray's ``RunningReplica``: its id and the last stats it recorded (``{}``: none yet)."""
    stats = {} if report is None else {**report.as_dict(), "replica": name}
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name), routing_stats=stats)


def request(method, *args, **kwargs):
    return SimpleNamespace(args=list(args), kwargs=kwargs, metadata=SimpleNamespace(call_method=method))


def router(**kwargs):
    made = ResidencyRouter.__new__(ResidencyRouter)  # the ranking needs no event loop or controller
    made._deployment_id = SimpleNamespace(app_name="test")  # what Ray's constructor would have set
    made.initialize_state(**router_kwargs(NEEDS, **kwargs))
    return made


def names(ranks):
    return [[one.replica_id.unique_id for one in rank] for rank in ranks]


def test_a_submit_goes_first_to_the_replica_holding_its_models():
    replicas = [
        replica("a", ResidencyReport(missing={"dit": 0})),
        replica("b", ResidencyReport(missing={"te": 0, "unet": 0}, queued=2)),
        replica("c", ResidencyReport(missing={"te": 0, "unet": 1000})),
    ]
    ranked = router().rank(replicas, request("submit", {"workflow": "sd"}))
    assert names(ranked) == [["b"], ["c"], ["a"]]
    assert names(router().rank(replicas, request("submit", {"workflow": "flux"}))) == [["a"], ["c", "b"]]


def test_out_of_balance_queues_send_by_queue_length():
    replicas = [replica("a", ResidencyReport(missing={"dit": 0}, queued=5)), replica("b", ResidencyReport())]
    assert names(router(imbalance=4).rank(replicas, request("submit", {"workflow": "flux"}))) == [
        ["b"],
        ["a"],
    ]
    assert names(router(imbalance=5).rank(replicas, request("submit", {"workflow": "flux"}))) == [
        ["a"],
        ["b"],
    ]


def test_a_replica_that_could_not_load_the_workflow_comes_last():
    replicas = [
        replica("a", ResidencyReport(missing={"dit": 0}, unloadable=["flux"])),
        replica("b", ResidencyReport()),
    ]
    assert names(router().rank(replicas, request("submit", {"workflow": "flux"}))) == [["b"], ["a"]]


def test_a_replica_without_a_report_yet_counts_as_empty():
    replicas = [replica("a", ResidencyReport(missing={"dit": 0})), replica("new")]
    assert names(router().rank(replicas, request("submit", {"workflow": "flux"}))) == [["a"], ["new"]]


def test_without_reports_or_a_known_workflow_rays_default_choice_applies():
    replicas = [replica("a"), replica("b")]
    assert router().rank(replicas, request("submit", {"workflow": "sd"})) is None  # no report yet
    reported = [replica("a", ResidencyReport()), replica("b", ResidencyReport())]
    for data in ({"workflow": "other"}, {}, "not a request"):
        assert router().rank(reported, request("submit", data)) is None
    assert router().rank(reported, request("needs")) is None


def test_a_call_about_a_job_goes_to_the_replica_its_id_names():
    replicas = [replica("a", ResidencyReport()), replica("b", ResidencyReport())]
    for method in ("describe", "cancel"):
        assert names(router().rank(replicas, request(method, "b:0123"))) == [["b"]]
    assert names(router().rank(replicas, request("result", "a:0123", 0))) == [["a"]]
    assert router().rank(replicas, request("describe", "gone:0123")) is None  # any replica says it is unknown


def test_the_only_workflow_served_is_a_request_naming_none():
    assert request_workflow([{"prompt": "x"}], {}, {"sd": {}}) == "sd"
    assert request_workflow([{"prompt": "x"}], {}, NEEDS) is None
    assert request_workflow([], {"data": {"workflow": "flux"}}, NEEDS) == "flux"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"needs": {"sd": {"te": "big"}}}, TypeError),
        ({"needs": ["sd"]}, TypeError),
        ({"needs": {}, "imbalance": -1}, ValueError),
        ({"needs": {}, "threshold": 3}, TypeError),
    ],
)
def test_bad_router_settings_are_refused(kwargs, error):
    made = ResidencyRouter.__new__(ResidencyRouter)
    with pytest.raises(error):
        made.initialize_state(**kwargs)
