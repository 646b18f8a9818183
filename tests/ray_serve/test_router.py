"""The residency router's ranking, on stand-ins for Ray's replicas and requests (no cluster). Skipped where
Ray Serve is not installed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')

from modular.ray_serve import streams
from modular.ray_serve.router import ResidencyRouter, router_kwargs
from modular.ray_serve.worker import request_workflow
from modular.serving import ResidencyReport

NEEDS = {"sd": {"te": 100, "unet": 1000}, "flux": {"dit": 3000}}


def replica(name, report=None):
    """A stand-in for Ray's ``RunningReplica``: its id and the last stats it recorded (``{}``: none yet)."""
    stats = {} if report is None else {**report.as_dict(), "replica": name}
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name), routing_stats=stats)


def request(method, *args, request_id="", **kwargs):
    metadata = SimpleNamespace(call_method=method, internal_request_id=request_id)
    return SimpleNamespace(args=list(args), kwargs=kwargs, metadata=metadata)


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
    ranked = router(imbalance=2).rank(replicas, request("submit", {"workflow": "sd"}))
    assert names(ranked) == [["b"], ["c"], ["a"]]  # b's two queued jobs within the imbalance
    ranked = router(imbalance=1).rank(replicas, request("submit", {"workflow": "sd"}))
    assert names(ranked) == [["c"], ["a"], ["b"]]  # beyond it: b last, by wait
    flux = request("submit", {"workflow": "flux"})
    assert names(router(imbalance=2).rank(replicas, flux)) == [["a"], ["c", "b"]]  # same bytes: by wait


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


def test_a_replica_that_would_move_the_models_waits_for_the_move_too():
    # "b" holds sd with two jobs queued (2 s each); "a" is idle but would move sd's 1100 bytes.
    holder = ResidencyReport(missing={"te": 0, "unet": 0}, queued=2, seconds={"sd": 2.0})

    def ranked(seconds_per_byte):
        idle = ResidencyReport(seconds={"sd": 2.0}, seconds_per_byte=seconds_per_byte)
        replicas = [replica("a", idle), replica("b", holder)]
        return names(router(imbalance=1).rank(replicas, request("submit", {"workflow": "sd"})))

    assert ranked(0.0) == [["a"], ["b"]]  # moves cost nothing measured: b's queue is beyond the imbalance
    # The move takes 1100 * 0.002 = 2.2 s: a's wait is 1.1 job times, b's 2: b is within 1 of the shortest.
    assert ranked(0.002) == [["b"], ["a"]]


@pytest.fixture
def streamed(monkeypatch):
    """A fresh table of this process's streamed jobs in place of the process's own."""
    fresh = streams.StreamedJobs()
    monkeypatch.setattr(streams, "STREAMED", fresh)
    return fresh


def test_streams_sent_since_the_last_report_count_in_the_replicas_wait(streamed):
    # Both reports are older than the jobs: they say "a" (holding sd) is idle. Three streams of sd have gone
    # to "a" since; the router knows, and sends the next one to "b".
    replicas = [replica("a", ResidencyReport(missing={"te": 0, "unet": 0})), replica("b", ResidencyReport())]
    made = router(imbalance=2)
    ids = [replica.replica_id for replica in replicas]
    for number in range(3):
        made.on_request_routed(request("run", {"workflow": "sd"}, request_id=f"j{number}"), ids[0], None)
    made.on_request_routed(
        request("submit", {"workflow": "sd"}, request_id="s"), ids[0], None
    )  # not followed
    assert [job.workflow for job in streamed.on("a")] == ["sd"] * 3
    assert names(made.rank(replicas, request("submit", {"workflow": "sd"}))) == [["b"], ["a"]]
    made.on_request_completed(ids[0], "j0")
    assert names(made.rank(replicas, request("submit", {"workflow": "sd"}))) == [
        ["a"],
        ["b"],
    ]  # within 2 jobs
    made.on_request_completed(ids[0], "j1")
    made.on_request_completed(ids[0], "s")  # a request the table never held: nothing changes
    assert len(streamed.on("a")) == 1


def test_a_stream_counts_on_the_replica_chosen_for_it_before_the_replica_accepts(streamed):
    replicas = [replica("a", ResidencyReport(missing={"te": 0, "unet": 0})), replica("b", ResidencyReport())]
    made = router(imbalance=0)
    assert names(made.rank(replicas, request("run", {"workflow": "sd"}, request_id="j1"))) == [["a"], ["b"]]
    assert [(job.replica, job.accepted) for job in streamed.on("a")] == [("a", False)]
    # The next job, while Ray still asks "a" about the first, sees "a" one job longer.
    assert names(made.rank(replicas, request("run", {"workflow": "sd"}, request_id="j2"))) == [["b"], ["a"]]
    made.on_request_routed(request("run", {"workflow": "sd"}, request_id="j2"), replicas[1].replica_id, None)
    assert [(job.replica, job.accepted) for job in streamed.on("b")] == [("b", True)]


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


def test_a_replica_found_for_one_request_goes_to_that_request_not_the_oldest_pending():
    """Ray hands a replica a ranking found to a pending request: ours, to the request it was ranked for (a FIFO
    router gives it to the oldest pending one, which may be another workflow's job). Ray's own constructor and
    matching, called as its routing loop calls them."""
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve._private.request_router.common import PendingRequest

    async def match(shared_id: bool) -> tuple[PendingRequest, PendingRequest, object]:
        made = ResidencyRouter(
            DeploymentID(name="ModularWorker", app_name="test"), DeploymentHandleSource.UNKNOWN
        )
        older, newer = (
            PendingRequest(
                args=[{"workflow": workflow}],
                kwargs={},
                metadata=RequestMetadata(
                    request_id=key, internal_request_id="shared" if shared_id else key, call_method="run"
                ),
            )
            for key, workflow in (("older", "flux"), ("newer", "sd"))
        )
        for pending in (older, newer):
            made._pending_requests_to_fulfill.append(pending)
            made._add_pending_request_to_indices(pending)
        holder = object()  # the replica ranked first for the newer request (it holds sd)
        made._fulfill_next_pending_request(holder, newer.metadata)
        return older, newer, holder

    # The calls one request makes (the ingress's call to each replica) share its id: matched all the same.
    for shared_id in (False, True):
        older, newer, holder = asyncio.run(match(shared_id))
        assert newer.future.done() and newer.future.result() is holder
        assert not older.future.done()  # still waiting for a replica ranked for it
