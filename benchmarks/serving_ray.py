"""Serving over Ray Serve: bytes moved to the replicas' devices and latency of one mixed stream, Ray's default
router against the residency router.

The stream of ``benchmarks/serving.py`` (the same workflows, tiny repos, seed and Poisson arrivals: its
``poisson_stream`` and requests) goes through the worker deployment of ``modular serve --ray``
(``modular.ray_serve.build_workers``: ``--replicas`` replicas of ``ReplicaWorker`` on a local Ray cluster),
each replica on a ``SimulatedDevice`` whose budget holds one family at a time (the larger one, not both), as
the single-machine benchmark's device. Each router runs the stream ``--repeats`` times in one process (3; the
two take turns going first), each time on a fresh deployment (every replica empty): Ray's default router
(power of two choices: ``build_workers(router=False)``) and the residency router (``router=True``: among the
replicas whose expected wait is within ``--imbalance`` job times of the shortest, the one that would move the
fewest bytes for the job's workflow; reports every ``--stats-period`` seconds). Bytes are summed over a
router's runs and latencies taken over all their jobs: on 2 shared cores one run's p95 (its second-longest
of 40 jobs) moves by more than the routers differ. Prefetch is off, so every byte is moved by the job that
needs it.

Each job is sent as the ingress sends it (the worker's streamed ``run``: Ray counts it ongoing on its replica
until it ends, which is what the default router balances) at its arrival time, in real time; the mean
inter-arrival time is ``--loads`` times the mean service time, measured first: warm jobs of each workflow
on one replica deployed as the runs' are (a warm job moves nothing, so its time is its compute; a replica has
one thread, as Ray gives a replica of under one CPU, where this process has every core: measured here, the
loads were heavier than they said). A move costs time, as on a device: each replica's simulated device moves
at the bandwidth that makes the largest family's move take ``--move`` mean warm job times (0.5;
``ReplicaWorker(budget, bandwidth=)``: the job's thread sleeps for it, ``SimulatedDevice(real_time=True)``),
and the replicas measure what a moved byte costs a job and report it (``seconds_per_byte``) to the residency
router. Latencies leave out each run's first ``WARMUP`` (4) jobs:
the replicas start empty and those jobs read their families' files, two to three warm job times under
either router, and were otherwise the runs' p95 (a replica that reads another family later in the run, as
the default router has them do, still pays for it in the latencies).
Bytes are each replica's ``moved_bytes()`` (its offload log's ``bytes_to_device``) summed, exact and
the same run to run for one routing; latency is submit to done (the time of the job's final event), real
seconds on a shared machine, so it varies from run to run. Per replica: the jobs routed to it, the repos of
their workflows, and the repos it loaded (the repos of the models its residency report names): a replica
loads at most the repos routed to it.

Targets: the residency router moves at least 50 % fewer bytes than the default (<= 0.5x); its p95 latency
is at most 1.1x the default's.

Run: ``python benchmarks/serving.py --ray`` (40 jobs at loads 1.5 and 1, 2 replicas, 3 runs each, about four
minutes on 2 CPU cores);
``python benchmarks/serving.py --ray --replicas 3 --jobs 60 --loads 0.4``; with ``--quick``, 8 jobs
of 2 steps (the test's run). Needs Ray Serve (``pip install ".[ray]"``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import ray
import serving  # benchmarks/serving.py: the stream, its requests and repos, the table's rows
from ray import serve

from modular.ray_serve import build_workers
from modular.ray_serve.worker import caller_id
from modular.serving import ServedWorkflow
from modular.serving.events import FINAL_KINDS
from offload.devices.units import MiB

BYTES_TARGET = 0.5  # the residency router's bytes at most this share of the default's: at least 50 % fewer
P95_TARGET = 1.1  # its p95 latency at most this multiple of the default's
RAY_CPUS = 2  # the local cluster's CPUs
PROBES = 3  # warm jobs of each workflow that measure its service time
WAIT = 120.0  # seconds a call to the deployment may take
#: Jobs at the start of each run left out of its latencies: they read the replicas' first families from their
#: files, under either router alike (bytes count every job).
WARMUP = 4


class Router(NamedTuple):
    label: str
    residency: bool


ROUTERS = (Router("Ray default (p2c)", residency=False), Router("residency", residency=True))


class Job(NamedTuple):
    """One job as it ran: its workflow, the replica it was routed to, and its submit, start and done times
    (seconds since the first arrival)."""

    workflow: str
    replica: str
    submitted: float
    started: float
    done: float


class Replica(NamedTuple):
    """One replica after the stream: its id, the bytes moved to its device, and the repos it loaded."""

    replica: str
    bytes_to_device: int
    loaded: frozenset[str]


class Result(NamedTuple):
    """One run of the stream through one router."""

    router: str
    jobs: list[Job]
    replicas: list[Replica]

    @property
    def bytes_to_device(self) -> int:
        return sum(replica.bytes_to_device for replica in self.replicas)

    @property
    def timed(self) -> list[Job]:
        """The jobs whose latencies count: all but the first ``WARMUP`` to arrive."""
        return sorted(self.jobs, key=lambda job: job.submitted)[WARMUP:]

    def latency(self, q: float) -> float:
        return float(np.percentile([job.done - job.submitted for job in self.timed], q))

    @property
    def makespan(self) -> float:
        return max(job.done for job in self.jobs) - min(job.submitted for job in self.jobs)

    @property
    def mean_ran(self) -> float:
        """Mean seconds a job ran on its replica (start to done): the service time under this run's load."""
        return float(np.mean([job.done - job.started for job in self.jobs]))

    def routed(self, replica: str) -> list[Job]:
        return [job for job in self.jobs if job.replica == replica]

    def routed_repos(self, replica: str) -> frozenset[str]:
        return frozenset(serving.family(job.workflow) for job in self.routed(replica))

    @property
    def loads_only_routed(self) -> bool:
        """Each replica loaded at most the repos of the jobs routed to it."""
        return all(replica.loaded <= self.routed_repos(replica.replica) for replica in self.replicas)


class Runs(NamedTuple):
    """Every run of one router: bytes summed over the runs, latencies over all their timed jobs (``--repeats``
    runs of 36 give a p95 of 108, not the second-longest of one run), makespan and service the runs' mean."""

    router: str
    runs: list[Result]

    @property
    def bytes_to_device(self) -> int:
        return sum(run.bytes_to_device for run in self.runs)

    def latency(self, q: float) -> float:
        return float(np.percentile([job.done - job.submitted for run in self.runs for job in run.timed], q))

    @property
    def makespan(self) -> float:
        return float(np.mean([run.makespan for run in self.runs]))

    @property
    def mean_ran(self) -> float:
        return float(np.mean([job.done - job.started for run in self.runs for job in run.jobs]))

    @property
    def loads_only_routed(self) -> bool:
        return all(run.loads_only_routed for run in self.runs)


def workflows(repos: Mapping[str, Path]) -> list[ServedWorkflow]:
    return [ServedWorkflow(s.name, str(repos[s.repo]), s.workflow) for s in serving.WORKFLOWS]


class Deployment(NamedTuple):
    """What every deployment of the benchmark shares: the repos, each replica's budget and bandwidth, the
    image of the jobs that take one, and the options."""

    repos: Mapping[str, Path]
    budget: int
    bandwidth: int | None
    image: tuple[str, bytes]
    args: argparse.Namespace

    def deploy(self, name: str, replicas: int, residency: bool) -> Any:
        """A fresh worker deployment (``residency``: the residency router, else Ray's default); its handle."""
        app = build_workers(
            workflows(self.repos),
            replicas,
            self.budget,
            self.args.imbalance,
            self.args.stats_period,
            num_cpus=RAY_CPUS / (self.args.replicas + 1),  # a run's share, the probe's one replica too
            router=residency,
            bandwidth=self.bandwidth,  # moves take real time on the replicas' simulated devices (None: none)
            prefetch=False,  # every byte moved by the job that needs it: bytes are exact
            preview_every=None,
            max_queue=10**6,
        )
        return serve.run(app, name=name, route_prefix=None)


def service_seconds(deployment: Deployment) -> dict[str, float]:
    """Each workflow's seconds for one warm job (the median of ``PROBES``, after a pass that loads its repo),
    on one replica deployed as each run's are: Ray gives a replica of under one CPU one thread, where this
    process has every core, so a job here takes less time than on a replica (and the loads would be heavier
    than they say). A warm job moves nothing: its time is its compute."""
    handle = deployment.deploy("bench-probe", 1, residency=False)
    try:
        seconds: dict[str, list[float]] = {served.name: [] for served in serving.WORKFLOWS}
        for _ in range(1 + PROBES):  # the first pass loads the repos from their files
            for number, served in enumerate(serving.WORKFLOWS):
                arrival = serving.Arrival(0.0, served.name, number)
                job = asyncio.run(_job(handle, arrival, time.time(), deployment.args.steps, deployment.image))
                seconds[served.name].append(job.done - job.started)
        return {name: float(np.median(ran[1:])) for name, ran in seconds.items()}
    finally:
        serve.delete("bench-probe")


def repo_of(load_id: str) -> str:
    """The repo folder's name of a load ID (``<repo>|<subfolder>|<variant>|<revision>``)."""
    return Path(load_id.split("|")[0]).name


def each_replica(handle: Any, method: str, count: int) -> dict[str, dict[str, Any]]:
    """The answer of every replica to ``method()``, by replica id: a call without a replica id reaches one
    replica as either router picks, and says which (``replica``), so call until ``count`` have answered."""
    answers: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + WAIT
    while len(answers) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{method}: {len(answers)} of {count} replicas answered in {WAIT:g} s")
        answer = getattr(handle, method).remote().result(timeout_s=WAIT)
        answers[answer["replica"]] = answer
    return answers


async def _job(
    handle: Any, arrival: serving.Arrival, start: float, steps: int, image: tuple[str, bytes]
) -> Job:
    """Send one arrival at its time (``start`` + its offset) as the ingress does, and follow it to its end."""
    await asyncio.sleep(max(0.0, start + arrival.at - time.time()))
    request, takes_image = serving.request_of(arrival, steps)
    submitted = time.time()
    images = {"image": image} if takes_image else {}
    stream = handle.options(stream=True).run.remote(request, images, caller=caller_id())
    replica, started = "", submitted
    async for event in stream:
        if event["kind"] == "assigned":
            replica = event["replica"]
        elif event["kind"] == "started":
            started = event["time"]
        elif event["kind"] in FINAL_KINDS:
            if event["kind"] != "done":
                raise RuntimeError(f"job {event['job']} {event['kind']}: {event.get('error')}")
            return Job(arrival.workflow, replica, submitted - start, started - start, event["time"] - start)
    raise RuntimeError(f"the stream of job {arrival.seed} ended before the job")


async def _stream(
    handle: Any, stream: Sequence[serving.Arrival], steps: int, image: tuple[str, bytes]
) -> list[Job]:
    start = time.time() + 0.5  # the first arrival, once every job is waiting for its time
    return list(await asyncio.gather(*(_job(handle, arrival, start, steps, image) for arrival in stream)))


def run_router(router: Router, stream: Sequence[serving.Arrival], deployment: Deployment) -> Result:
    """The stream through a fresh deployment routed by ``router``; the deployment is deleted after."""
    name = f"bench-{'residency' if router.residency else 'default'}"
    replicas = deployment.args.replicas
    handle = deployment.deploy(name, replicas, router.residency)
    try:
        jobs = asyncio.run(_stream(handle, stream, deployment.args.steps, deployment.image))
        moved = each_replica(handle, "moved_bytes", replicas)
        stats = each_replica(handle, "record_routing_stats", replicas)
        ran = [
            Replica(key, moved[key]["bytes_to_device"], frozenset(map(repo_of, stats[key]["missing"])))
            for key in sorted(moved)
        ]
        return Result(router.label, sorted(jobs, key=lambda job: job.submitted), ran)
    finally:
        serve.delete(name)


def table(results: Sequence[Runs]) -> list[str]:
    """One line per router; ``x default`` columns are the ratio to the first router's figure."""
    heads = ["MiB to dev", "x default", "p50 s", "p95 s", "x default", "max s", "makespan", "mean ran"]
    lines = [serving.row("router", heads)]
    default = results[0]
    for r in results:
        cells = [
            f"{r.bytes_to_device / MiB:.2f}",
            f"{r.bytes_to_device / default.bytes_to_device:.2f}x",
            f"{r.latency(50):.2f}",
            f"{r.latency(95):.2f}",
            f"{r.latency(95) / default.latency(95):.2f}x",
            f"{r.latency(100):.2f}",
            f"{r.makespan:.2f}",
            f"{r.mean_ran:.3f}",
        ]
        lines.append(serving.row(r.router, cells))
    return lines


def replica_table(results: Sequence[Runs]) -> list[str]:
    """One line per replica of each run of each router: the jobs and repos routed to it, the repos it loaded,
    its bytes."""
    lines = [
        f"{'router':<22} {'replica':<10} {'jobs':>5} {'MiB to dev':>10}  {'routed repos':<22} loaded repos"
    ]
    for r in (run for runs in results for run in runs.runs):
        for replica in r.replicas:
            routed = ",".join(sorted(r.routed_repos(replica.replica))) or "-"
            loaded = ",".join(sorted(replica.loaded)) or "-"
            lines.append(
                f"{r.router:<22} {replica.replica[:10]:<10} {len(r.routed(replica.replica)):>5} "
                f"{replica.bytes_to_device / MiB:>10.2f}  {routed:<22} {loaded}"
            )
    return lines


def targets(results: Sequence[Runs]) -> list[tuple[str, bool]]:
    """Each target with its figure, and whether it is met."""
    default, residency = results[0], results[1]
    share = residency.bytes_to_device / default.bytes_to_device
    p95 = residency.latency(95) / default.latency(95)
    checks = [
        (
            f"residency moves {share:.2f}x the default's bytes ({1 - share:.0%} fewer; target <= {BYTES_TARGET}x)",
            share <= BYTES_TARGET,
        ),
        (f"residency p95 latency {p95:.2f}x the default's (target <= {P95_TARGET}x)", p95 <= P95_TARGET),
    ]
    for r in results:
        checks.append((f"{r.router}: each replica loads at most the repos routed to it", r.loads_only_routed))
    return checks


def run(args: argparse.Namespace) -> int:
    """Both routers at each load; a table of each, a table of the replicas and the targets per load; returns 0."""
    with tempfile.TemporaryDirectory(prefix="serving-ray-bench-") as scratch:
        repos = serving.make_repos(Path(scratch))
        bench = serving.Bench(repos, args)  # its family sizes and its device's budget: one family at a time
        sizes, budget = bench.sizes, bench.budget
        del bench
        data = Path(repos["image"]).read_bytes()
        image = (f"{hashlib.sha256(data).hexdigest()}.png", data)
        ray.init(
            num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1"
        )
        try:
            serve.start(proxy_location="Disabled")
            deployment = Deployment(repos, budget, None, image, args)
            service = service_seconds(deployment)
            mean_service = sum(service.values()) / len(service)
            # The simulated devices' bandwidth: the largest family's move takes --move mean warm job times.
            bandwidth = int(max(sizes.values()) / (args.move * mean_service)) if args.move else None
            deployment = deployment._replace(bandwidth=bandwidth)
            for line in heading(args, sizes, budget, bandwidth, service):
                print(line)
            for load in args.loads:
                stream = serving.poisson_stream(args.jobs, load * mean_service, args.seed)
                runs: dict[str, list[Result]] = {router.label: [] for router in ROUTERS}
                for repeat in range(args.repeats):  # the routers take turns going first: neither always cold
                    for router in ROUTERS if repeat % 2 == 0 else ROUTERS[::-1]:
                        runs[router.label].append(run_router(router, stream, deployment))
                results = [Runs(label, done) for label, done in runs.items()]
                print()
                print(
                    f"[load: mean inter-arrival {load:g}x the mean service = {load * mean_service:.3f} s; "
                    f"{args.repeats} run(s) of each router]"
                )
                for line in table(results):
                    print(line)
                for line in serving.verdicts(targets(results)):
                    print(line)
                print()
                for line in replica_table(results):
                    print(line)
        finally:
            serve.shutdown()
            ray.shutdown()
    return 0


def heading(
    args: argparse.Namespace,
    sizes: Mapping[str, int],
    budget: int,
    bandwidth: int | None,
    service: Mapping[str, float],
) -> list[str]:
    """The lines before the tables: the stream, the families and devices, the moves, the service times."""
    mean_service = sum(service.values()) / len(service)
    moves = (
        f"{bandwidth / MiB:.1f} MiB/s: the largest family's move takes {args.move:g} mean warm job times"
        if bandwidth
        else "moves take no time"
    )
    return [
        f"Serving over Ray: {args.jobs} jobs per load over {', '.join(s.name for s in serving.WORKFLOWS)} "
        f"(drawn uniformly, seed {args.seed}), {args.steps} steps, {serving.SIZE}, real time; "
        f"{args.replicas} replicas on a local Ray cluster ({RAY_CPUS} CPUs)",
        "families (MiB): "
        + ", ".join(f"{repo} {nbytes / MiB:.2f}" for repo, nbytes in sizes.items())
        + f"; each replica a simulated device of {budget / MiB:.2f} MiB (one family at a time), prefetch off; "
        f"residency router: reports every {args.stats_period:g} s, imbalance {args.imbalance}",
        f"simulated devices' host-to-device bandwidth {moves}",
        f"latencies: every job but each run's first {WARMUP} (they read the replicas' first families' files)",
        "service s of a warm job on one replica: "
        + ", ".join(f"{name} {seconds:.3f}" for name, seconds in service.items())
        + f"; mean {mean_service:.3f} s",
    ]
