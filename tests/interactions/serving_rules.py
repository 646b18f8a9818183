"""The interaction machine's serving rules: jobs through a Scheduler over the side under test's manager (its
served workflows, SD and Flux on the world's tiny repos, load through that manager, so they share the models of
the machine's own pipelines, with their LoRA, IP-Adapter, quantized loads and offload settings), and a cancel
of a waiting or a running job. The shadow serves the same workflows on its own manager, called directly
(``call_job``, no scheduler): each job's result equals the shadow's call (identical PNG bytes), or both fail
with the same error type. Kept apart from tests/interactions/machine.py, which mixes them in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from modular.batch.jobs import call_job
from modular.batch.store import encode
from modular.serving import EventHub, ResidencyReport, Scheduler, ServedWorkflow, ServedWorkflows

from .watched_rules import assert_nothing_running
from .world import Outcome, Side, outcome

#: The served workflows: name -> the family whose tiny repo it serves.
SERVED = {"sd": "sd", "flux": "flux"}
SMALL = {"prompt": "a cat", "steps": 1, "size": "32x32"}


class CancellingHub(EventHub):
    """Events as the scheduler publishes them; at the first step of the job named in ``cancel_at``, that job
    is cancelled (from the worker's thread, as another thread's cancel would land there)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduler: Scheduler | None = None
        self.cancel_at: str | None = None

    def publish(self, kind: str, job_id: str | None = None, **fields: Any) -> dict[str, Any]:
        event = super().publish(kind, job_id, **fields)
        if kind == "step" and job_id is not None and job_id == self.cancel_at and self.scheduler is not None:
            self.cancel_at = None
            self.scheduler.cancel(job_id, "cancelled at its first step")
        return event


def serve(side: Side) -> ServedWorkflows:
    """The served workflows on ``side``'s manager, every pipeline loaded now (so both sides load them at the
    same point of the example: a model marked modified since is not handed out to a later load)."""
    served = ServedWorkflows(
        [ServedWorkflow(name, str(side.files.repos[family])) for name, family in SERVED.items()], side.cm
    )
    for name in served:
        served.load(name)
    return served


class ServingRules:
    """Rules mixed into ``InteractionMachine`` (which provides ``main``, ``shadow``, ``trace``, ``scratch``)."""

    main: Side
    shadow: Side
    trace: list[str]
    scratch: Path
    _scheduler: Scheduler | None = None
    _shadow_served: ServedWorkflows | None = None
    _hub: CancellingHub | None = None

    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            self._hub = CancellingHub()
            self._scheduler = Scheduler(serve(self.main), self.scratch / "serving", events=self._hub)
            self._hub.scheduler = self._scheduler
            self._shadow_served = serve(self.shadow)
        return self._scheduler

    def close_serving(self) -> None:
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None

    def shadow_pngs(self, job: Any) -> Outcome:
        """The shadow's direct call of ``job``'s request: its images' PNG bytes, or the error."""
        assert self._shadow_served is not None
        pipe = self._shadow_served.pipeline(job.workflow)
        return outcome(
            lambda: [encode(call_job(pipe, entry.job({}, False)), "png") for entry in job.request.entries]
        )

    def assert_job_as_shadow(self, job: Any) -> None:
        scheduler = self.scheduler()
        expected = self.shadow_pngs(job)
        if expected.error is not None:
            assert job.state == "failed", (
                f"{job.workflow}: {job.state} under test; {expected} without offload"
            )
            assert job.error.startswith(f"{expected.error.__name__}:"), (job.error, expected)
            return
        assert job.state == "done", f"{job.workflow}: {job.state} ({job.error}); the shadow's call ran"
        got = [(scheduler.results / name).read_bytes() for name in job.results]
        assert got == expected.value, (
            f"after {self.trace}: {job.workflow}'s result differs from the shadow's call"
        )

    @rule(workflow=st.sampled_from(sorted(SERVED)), seed=st.integers(0, 3))
    def serve_a_job(self, workflow, seed):
        scheduler = self.scheduler()
        self.trace.append(f"scheduler.submit({workflow}, seed={seed}); run_next()")
        before = self.moved_so_far()
        job = scheduler.submit({"workflow": workflow, **SMALL, "seed": seed})
        assert scheduler.run_next() is job
        scheduler.wait_prefetch(60)
        self.assert_job_as_shadow(job)
        if job.state == "done":  # what the router is told it moved: within what the log moved meanwhile
            assert 0 <= scheduler.job_times.moved(workflow)[-1] <= self.moved_so_far() - before

    def moved_so_far(self) -> int:
        log = self.main.cm.offload_log
        return 0 if log is None else log.total_bytes_to_device

    @rule(workflows=st.lists(st.sampled_from(sorted(SERVED)), min_size=2, max_size=2), running=st.booleans())
    def cancel_a_job(self, workflows, running):
        """Two jobs queued; the second cancelled while it waits, or the first at its first step (running). The
        other one runs to its end as the shadow's call; the cancelled one writes nothing (a running one whose
        call fails before its first step, as the shadow's does, fails instead)."""
        scheduler = self.scheduler()
        assert self._hub is not None
        first, second = (scheduler.submit({"workflow": name, **SMALL, "seed": 5}) for name in workflows)
        cancelled, other = (first, second) if running else (second, first)
        self.trace.append(f"scheduler: {workflows}, cancel the {'running' if running else 'waiting'} one")
        if running:
            self._hub.cancel_at = cancelled.id
        else:
            scheduler.cancel(cancelled.id)
            assert cancelled.state == "cancelled"
        while scheduler.run_next() is not None:
            pass
        scheduler.wait_prefetch(60)
        self._hub.cancel_at = None
        if running and self.shadow_pngs(cancelled).error is not None:  # it fails before its first step
            self.assert_job_as_shadow(cancelled)
        else:
            assert cancelled.state == "cancelled", (cancelled.state, cancelled.error)
        assert cancelled.results == []
        assert not any(path.name.startswith(cancelled.id) for path in scheduler.results.glob("*"))
        assert_nothing_running(self.main)
        self.assert_job_as_shadow(other)

    @invariant()
    def serving_holds(self):
        """The queue is empty between rules, every job it took ended, and the manager's table prints."""
        if self._scheduler is None:
            return
        assert self._scheduler.running is None and self._scheduler.waiting() == []
        assert all(job["state"] in ("done", "failed", "cancelled") for job in self._scheduler.jobs())
        assert str(self.main.cm) and self.main.cm.table()
        report = self._scheduler.residency_report()  # what a router would be told: JSON values, read back
        assert ResidencyReport.from_dict(json.loads(json.dumps(report.as_dict()))) == report
        assert report.queued == 0 and report.seconds_per_byte >= 0
