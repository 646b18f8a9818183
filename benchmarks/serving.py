"""Serving order: bytes moved to the device and latency of one mixed stream under three scheduler orders.

One stream of jobs over three workflows of two families (tiny SD text-to-image and image-to-image on one
repo, tiny SDXL text-to-image), drawn uniformly with Poisson arrivals from a fixed seed, runs through
``modular.serving.Scheduler`` on an ``offload.SimulatedDevice`` whose budget holds one family at a time (the
larger one, not both: a switch of family moves most of a family), once in each order:

- ``arrival (FIFO)``: ``Scheduler(affinity=False)``, the first-come order of other servers, our offload rule;
- ``affinity``: ``Scheduler(affinity=True)``, the job whose models cost least to bring to the device first;
- ``arrival, peer's rule``: arrival order with evictions by ``offload.SmallestSufficientSet``, the rule of
  diffusers' own manager (``AutoOffloadStrategy``), set by ``enable_auto_cpu_offload(offload_strategy=)``.

Each order runs at each load: a mean inter-arrival time of ``--loads`` times the mean service time (the mean,
over the workflows, of one job on an empty device: its copies and its compute; at the default bandwidth a
family's copies take about twice a job's compute). At 1x a queue seldom holds two jobs, so the orders seldom
differ; at 0.5x arrival order cannot keep up (it swaps families about every other job), a queue forms, and
the order decides how often a family is swapped. Time is virtual, so every figure is the same run
to run: the scheduler reads a virtual clock (``Scheduler(clock=)``: fairness reads it too), arrivals are
submitted as the virtual time passes them, and a job lasts what the engine's simulated clock says
(``SimulatedDevice(h2d_bandwidth=, compute_time=)``): its copies at ``--bandwidth`` and a fixed cost per
forward of each model (``--denoise-seconds`` per denoiser step, ``--other-seconds`` per call of the others).
Prefetch is off, so every byte is moved by the job that needs it; bytes are the offload log's
``bytes_to_device``. Latency is arrival to finish, wait is arrival to start, makespan the first arrival to
the last finish; ``due`` counts jobs that waited ``max_wait`` or more (fairness ran them ahead of the order).

Targets: affinity moves at least 35 % fewer bytes than FIFO (<= 0.65x); its p95 latency is at most 1.25x
FIFO's; its longest wait is within ``max_wait`` plus the longest job (a job that falls due runs after the job
running then: jobs are not preempted; ``modular/serving/policy.py``).

Run: ``python benchmarks/serving.py`` (120 jobs per load, about two minutes on 2 CPU cores);
``python benchmarks/serving.py --jobs 200 --seed 3 --loads 0.8``; ``--quick`` is the test's short run
(8 jobs per load, 2 steps: too short a stream for the targets, which need a queue to form).

``--ray`` runs the same stream over worker replicas on a local Ray cluster instead (``--replicas`` 2 or 3,
``--stats-period``, ``--imbalance``, ``--repeats``), Ray's default router against the residency router, in
real time, at loads 1.5 and 1 (``--quick``: 1 only, one run each): ``benchmarks/serving_ray.py``
(``python benchmarks/serving.py --ray``; needs Ray Serve).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import PIL.Image  # noqa: E402
import torch  # noqa: E402

import components.quiet_imports  # noqa: E402, F401  (the tiny repos' diffusers imports: no torchao noise)
from components import ComponentsManager  # noqa: E402
from modular.serving import Fairness, Scheduler, ServedWorkflow, ServedWorkflows  # noqa: E402
from modular.serving.residency import DEFAULT_IMBALANCE  # noqa: E402
from offload import SimulatedDevice, SmallestSufficientSet  # noqa: E402
from offload.devices.units import MiB  # noqa: E402

BYTES_TARGET = 0.65  # affinity's bytes at most this share of FIFO's: at least 35 % fewer
P95_TARGET = 1.25  # affinity's p95 latency at most this multiple of FIFO's
SIZE = "32x32"
RAY_JOBS = 40  # jobs of the stream with --ray (real time on real processes: a shorter stream)
#: Mean inter-arrivals with --ray, in mean service times: moderate and high load (the replicas share 2 cores
#: here, so at 1 a job runs about 1.4x its time alone and the two replicas are busy about 80 % of the time).
RAY_LOADS = (1.5, 1.0)
RAY_REPEATS = 3  # runs of each router with --ray: one run's p95 of 40 jobs is its second-longest job
#: With --ray, the seconds a replica takes to move the largest family to its device, in mean warm job times:
#: on a GPU a move costs time, from host memory a fraction of a job, from the weight files about one (SDXL's
#: 6.9 GB in fp16 over PCIe, against a 30-step job of a few seconds); half a job is between.
RAY_MOVE = 0.5


class Served(NamedTuple):
    """A served workflow of the stream: its name, family (repo folder) and workflow, and whether it takes
    the input image."""

    name: str
    repo: str
    workflow: str
    image: bool = False


WORKFLOWS = (
    Served("sd", "tiny-sd", "text2image"),
    Served("sd-img2img", "tiny-sd", "image2image", image=True),
    Served("sdxl", "tiny-sdxl", "text2image"),
)


class Order(NamedTuple):
    label: str
    affinity: bool
    peer_rule: bool


ORDERS = (
    Order("arrival (FIFO)", affinity=False, peer_rule=False),
    Order("affinity", affinity=True, peer_rule=False),
    Order("arrival, peer's rule", affinity=False, peer_rule=True),
)


class Arrival(NamedTuple):
    at: float  # virtual seconds
    workflow: str
    seed: int


class Finished(NamedTuple):
    """One job as it ran: its arrival, start and finish in virtual seconds, and the bytes it moved."""

    workflow: str
    arrived: float
    started: float
    finished: float
    bytes_to_device: int


class Result(NamedTuple):
    order: str
    jobs: list[Finished]
    bytes_to_device: int

    @property
    def makespan(self) -> float:
        return max(job.finished for job in self.jobs) - min(job.arrived for job in self.jobs)

    def latency(self, q: float) -> float:
        return float(np.percentile([job.finished - job.arrived for job in self.jobs], q))

    @property
    def max_wait(self) -> float:
        return max(job.started - job.arrived for job in self.jobs)

    @property
    def switches(self) -> int:
        """Times the job run was of the other family than the one before it."""
        families = [family(job.workflow) for job in self.jobs]
        return sum(a != b for a, b in zip(families, families[1:]))


def family(workflow: str) -> str:
    """The family (repo folder) of a workflow of the stream."""
    return next(served.repo for served in WORKFLOWS if served.name == workflow)


def request_of(arrival: Arrival, steps: int) -> tuple[dict[str, Any], bool]:
    """The request of one arrival, and whether its workflow takes the input image."""
    served = next(s for s in WORKFLOWS if s.name == arrival.workflow)
    request: dict[str, Any] = {
        "workflow": served.name,
        "prompt": f"a photo of job {arrival.seed}",
        "seed": arrival.seed,
        "steps": steps,
    }
    if not served.image:
        request["size"] = SIZE  # image-to-image makes the input image's size
    return request, served.image


def row(label: str, cells: Sequence[str]) -> str:
    """One line of a table: the label in 22 characters, then each cell in 10 (the header is a row too)."""
    return f"{label:<22} " + " ".join(f"{cell:>10}" for cell in cells)


def verdicts(targets: Sequence[tuple[str, bool]]) -> list[str]:
    """The lines of the targets under a table: each figure, and whether it is met."""
    return [f"  {text}: {'met' if met else 'NOT met'}" for text, met in targets]


class VirtualClock:
    """The scheduler's clock: virtual seconds, moved by the benchmark's loop only."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_repos(folder: Path) -> dict[str, Path]:
    """The tiny repos of the stream, and the input image of image-to-image."""
    from blocks.stable_diffusion import make_tiny_repo as tiny_sd
    from blocks.stable_diffusion_xl import make_tiny_repo as tiny_sdxl

    image = folder / "input.png"
    PIL.Image.new("RGB", (32, 32), (140, 90, 40)).save(image)
    return {
        "tiny-sd": tiny_sd(folder / "tiny-sd"),
        "tiny-sdxl": tiny_sdxl(folder / "tiny-sdxl"),
        "image": image,
    }


def family_bytes(served: ServedWorkflows) -> dict[str, int]:
    """Weight bytes of each repo's models (its workflows share them), every workflow loaded."""
    models: dict[str, dict[int, torch.nn.Module]] = {}
    for workflow in WORKFLOWS:
        pipe = served.pipeline(workflow.name)
        for name in pipe.component_names:
            module = getattr(pipe, name, None)
            if isinstance(module, torch.nn.Module):
                models.setdefault(workflow.repo, {})[id(module)] = module
    return {
        repo: sum(
            t.numel() * t.element_size() for m in found.values() for t in (*m.parameters(), *m.buffers())
        )
        for repo, found in models.items()
    }


class Bench:
    """One manager with every workflow loaded (to the host, before offload starts), for every run."""

    def __init__(self, repos: dict[str, Path], args: argparse.Namespace):
        self.args = args
        self.image = repos["image"]
        self.manager = ComponentsManager()
        workflows = [ServedWorkflow(s.name, str(repos[s.repo]), s.workflow) for s in WORKFLOWS]
        self.served = ServedWorkflows(workflows, self.manager)
        for served in WORKFLOWS:
            self.served.load(served.name)
        self.sizes = family_bytes(self.served)
        self.budget = max(self.sizes.values()) + MiB // 8  # the larger family, not both
        self.compute = {
            component_id: args.denoise_seconds
            if component_id.startswith(("unet", "transformer"))
            else args.other_seconds
            for component_id, module in self.manager.components.items()
            if isinstance(module, torch.nn.Module)
        }

    def start(self, order: Order, max_wait: float) -> Run:
        """Auto offload on a fresh (empty) simulated device and a scheduler of ``order`` on a virtual clock."""
        self.manager.enable_auto_cpu_offload(
            device=SimulatedDevice(self.budget, h2d_bandwidth=self.args.bandwidth, compute_time=self.compute),
            memory_reserve_margin=0,
            offload_strategy=SmallestSufficientSet() if order.peer_rule else None,
        )
        clock = VirtualClock()
        scheduler = Scheduler(
            self.served,
            fairness=Fairness(max_wait=max_wait, max_bypass=self.args.max_bypass),
            clock=clock,
            prefetch=False,  # every byte moved by the job that needs it: bytes are exact
            preview_every=None,
            affinity=order.affinity,
            max_queue=10**6,
        )
        return Run(self, scheduler, clock)


class Run:
    """One scheduler over the bench's manager; ``close`` turns offload off (the next run starts empty)."""

    def __init__(self, bench: Bench, scheduler: Scheduler, clock: VirtualClock):
        self.bench = bench
        self.scheduler = scheduler
        self.clock = clock
        self.log = bench.manager.offload_log
        (engine,) = bench.manager.offload_engines
        self.simulated = engine.simulated_clock

    def submit(self, arrival: Arrival) -> Any:
        request, image = request_of(arrival, self.bench.args.steps)
        return self.scheduler.submit(request, {"image": self.bench.image} if image else None)

    def run_job(self) -> tuple[Any, float, int]:
        """Run the next job; its virtual duration (the simulated clock's advance) and the bytes it moved."""
        before, moved = self.simulated.now, self.log.total_bytes_to_device
        job = self.scheduler.run_next()
        if job is None or job.state != "done":
            raise RuntimeError(
                f"job {getattr(job, 'id', None)} did not finish: {getattr(job, 'error', None)}"
            )
        return job, self.simulated.now - before, self.log.total_bytes_to_device - moved

    def close(self) -> None:
        self.scheduler.close()
        self.bench.manager.disable_auto_cpu_offload()


def service_seconds(bench: Bench) -> dict[str, float]:
    """Each workflow's virtual seconds for one job on an empty device (its copies and its compute)."""
    seconds = {}
    for served in WORKFLOWS:
        run = bench.start(ORDERS[0], 1.0)
        try:
            run.submit(Arrival(0.0, served.name, 0))
            seconds[served.name] = run.run_job()[1]
        finally:
            run.close()
    return seconds


def poisson_stream(count: int, mean_gap: float, seed: int) -> list[Arrival]:
    """``count`` jobs, workflows drawn uniformly, gaps drawn exponential with mean ``mean_gap``."""
    draw = random.Random(seed)
    at, stream = 0.0, []
    for number in range(count):
        stream.append(Arrival(at, draw.choice(WORKFLOWS).name, number))
        at += draw.expovariate(1.0 / mean_gap)
    return stream


def run_order(bench: Bench, order: Order, stream: Sequence[Arrival], max_wait: float) -> Result:
    """The stream through one order, in virtual time: arrivals submitted as the time passes them, one job at
    a time, each lasting its simulated seconds."""
    run = bench.start(order, max_wait)
    arrivals = {}
    finished = []
    pending = list(stream)
    try:
        while pending or run.scheduler.waiting():
            while pending and pending[0].at <= run.clock.now:
                arrival = pending.pop(0)
                now, run.clock.now = run.clock.now, arrival.at  # queued at its own time, not the loop's
                arrivals[run.submit(arrival).id] = arrival
                run.clock.now = now
            if not run.scheduler.waiting():
                run.clock.now = pending[0].at  # idle until the next arrival
                continue
            started = run.clock.now
            job, seconds, moved = run.run_job()
            run.clock.now = started + seconds
            finished.append(Finished(job.workflow, arrivals[job.id].at, started, run.clock.now, moved))
        return Result(order.label, finished, run.log.total_bytes_to_device)
    finally:
        run.close()


def table(results: Sequence[Result], max_wait: float) -> list[str]:
    """One line per order; ``x FIFO`` columns are the ratio to the first order's figure."""
    heads = [
        "MiB to dev",
        "x FIFO",
        "switches",
        "makespan",
        "p50 s",
        "p95 s",
        "x FIFO",
        "max s",
        "max wait",
        "due",
    ]
    lines = [row("order", heads)]
    fifo = results[0]
    for r in results:
        cells = [
            f"{r.bytes_to_device / MiB:.2f}",
            f"{r.bytes_to_device / fifo.bytes_to_device:.2f}x",
            str(r.switches),
            f"{r.makespan:.2f}",
            f"{r.latency(50):.2f}",
            f"{r.latency(95):.2f}",
            f"{r.latency(95) / fifo.latency(95):.2f}x",
            f"{r.latency(100):.2f}",
            f"{r.max_wait:.2f}",
            str(sum(job.started - job.arrived >= max_wait for job in r.jobs)),
        ]
        lines.append(row(r.order, cells))
    return lines


def targets(results: Sequence[Result], max_wait: float, longest_job: float) -> list[tuple[str, bool]]:
    """Each target with its figure, and whether it is met."""
    fifo, affinity = results[0], results[1]
    share = affinity.bytes_to_device / fifo.bytes_to_device
    p95 = affinity.latency(95) / fifo.latency(95)
    bound = max_wait + longest_job
    return [
        (
            f"affinity moves {share:.2f}x FIFO's bytes ({1 - share:.0%} fewer; target <= {BYTES_TARGET}x)",
            share <= BYTES_TARGET,
        ),
        (f"affinity p95 latency {p95:.2f}x FIFO's (target <= {P95_TARGET}x)", p95 <= P95_TARGET),
        (
            f"affinity max wait {affinity.max_wait:.2f} s, {affinity.max_wait / max_wait:.2f}x max_wait (target <= "
            f"max_wait {max_wait:.2f} s + the longest job {longest_job:.2f} s = {bound:.2f} s)",
            affinity.max_wait <= bound,
        ),
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--jobs", type=int, help=f"jobs in the stream at each load (default 120; with --ray, {RAY_JOBS})"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the stream's workflows and arrivals")
    parser.add_argument(
        "--loads",
        type=float,
        nargs="+",
        help="mean inter-arrival times, in mean service times (default 1 and 0.5; with --ray, "
        + " and ".join(f"{load:g}" for load in RAY_LOADS)
        + ")",
    )
    parser.add_argument("--steps", type=int, default=4, help="denoising steps per job (default 4)")
    parser.add_argument(
        "--bandwidth", default="16MB/s", help="simulated host-to-device bandwidth (default 16MB/s)"
    )
    parser.add_argument(
        "--denoise-seconds", type=float, default=0.05, help="virtual seconds of a denoiser step"
    )
    parser.add_argument(
        "--other-seconds", type=float, default=0.02, help="virtual seconds of any other model call"
    )
    parser.add_argument(
        "--max-wait", type=float, default=6.0, help="fairness max_wait, in mean service times (default 6)"
    )
    parser.add_argument(
        "--max-bypass",
        type=int,
        default=Fairness().max_bypass,
        help="fairness max_bypass (default: the server's)",
    )
    parser.add_argument("--quick", action="store_true", help="8 jobs per load, 2 steps: the test's short run")
    ray = parser.add_argument_group("over Ray Serve (benchmarks/serving_ray.py)")
    ray.add_argument(
        "--ray",
        action="store_true",
        help="the stream over worker replicas on a local Ray cluster, Ray's default router against the residency router",
    )
    ray.add_argument("--replicas", type=int, choices=(2, 3), default=2, help="worker replicas (default 2)")
    ray.add_argument(
        "--repeats",
        type=int,
        default=RAY_REPEATS,
        help=f"runs of the stream through each router, taking turns (default {RAY_REPEATS}; 1 with --quick)",
    )
    ray.add_argument(
        "--stats-period",
        type=float,
        default=0.2,
        help="seconds between two residency reports of a replica (default 0.2)",
    )
    ray.add_argument(
        "--move",
        type=float,
        default=RAY_MOVE,
        help="seconds a replica's move of the largest family takes, in mean warm job times: its simulated "
        f"device's bandwidth, moves taking real time (default {RAY_MOVE:g}; 0: moves take no time)",
    )
    ray.add_argument(
        "--imbalance",
        type=float,
        default=DEFAULT_IMBALANCE,
        help="job times by which a replica's expected wait may exceed the shortest and the router still "
        f"choose it for the models it holds (default {DEFAULT_IMBALANCE:g})",
    )
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = RAY_JOBS if args.ray else 120
    if args.loads is None:
        args.loads = ([RAY_LOADS[-1]] if args.quick else list(RAY_LOADS)) if args.ray else [1.0, 0.5]
    if args.quick:
        args.jobs, args.steps, args.repeats = 8, 2, 1
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1 (got {args.repeats})")
    if not 0 <= args.move < float("inf"):
        parser.error(f"--move must be a number of job times of at least 0 (got {args.move})")
    if args.ray and importlib.util.find_spec("ray") is None:
        parser.error('--ray needs Ray Serve: pip install "modular-pipelines[ray]"')
    if args.jobs < 2:
        parser.error(f"--jobs must be at least 2 (got {args.jobs})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every order at each load and print a table and the targets per load; returns 0."""
    args = parse_args(argv)
    threads, disabled = torch.get_num_threads(), logging.root.manager.disable
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # diffusers' one-off notices are not part of the measurement
    try:
        if args.ray:
            import serving_ray  # benchmarks/serving_ray.py: imports Ray, so only when asked

            return serving_ray.run(args)
        return _run(args)
    finally:  # imported and run by the tests: leave the process's settings as they were
        torch.set_num_threads(threads)
        logging.disable(disabled)


def _run(args: argparse.Namespace) -> int:
    """The run itself, with the settings `main` makes."""
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as scratch:
        bench = Bench(make_repos(Path(scratch)), args)
        service = service_seconds(bench)
        mean_service = sum(service.values()) / len(service)
        max_wait = args.max_wait * mean_service
        print(
            f"Serving order: {args.jobs} jobs per load over {', '.join(s.name for s in WORKFLOWS)} (drawn "
            f"uniformly, seed {args.seed}), {args.steps} steps, {SIZE}, virtual time"
        )
        print(
            "families (MiB): "
            + ", ".join(f"{repo} {nbytes / MiB:.2f}" for repo, nbytes in bench.sizes.items())
            + f"; simulated device {bench.budget / MiB:.2f} MiB (one family at a time), h2d {args.bandwidth}, "
            f"denoiser step {args.denoise_seconds} s, other calls {args.other_seconds} s, prefetch off"
        )
        print(
            "service s on an empty device: "
            + ", ".join(f"{name} {seconds:.3f}" for name, seconds in service.items())
            + f"; mean {mean_service:.3f} s; fairness max_wait {max_wait:.2f} s ({args.max_wait:g}x the mean), "
            f"max_bypass {args.max_bypass}"
        )
        for load in args.loads:
            stream = poisson_stream(args.jobs, load * mean_service, args.seed)
            results = [run_order(bench, order, stream, max_wait) for order in ORDERS]
            print()
            print(f"[load: mean inter-arrival {load:g}x the mean service = {load * mean_service:.3f} s]")
            for line in table(results, max_wait):
                print(line)
            for line in verdicts(targets(results, max_wait, max(service.values()))):
                print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
