"""Running a batch job: checked whole first, then data-parallel over the ranks, resumable at any point.

Every rank checks the job and binds its pipelines (index files read, inputs checked, no weights) before
anything loads. Rank 0 then removes the temporary files a killed run left, finds the finished entries
(``OutputStore.resume``: an output that is damaged, or was made from another entry or input image, is
made again, and the run names it) and tells the other ranks which entries are left; each rank takes every
``world_size``-th of them, loads the components of a workflow through its own ``ComponentsManager``
when its first entry needs them (on ``cuda:LOCAL_RANK``, or under auto offload when asked), and
writes each output as it finishes. Rank 0 shows one bar for the whole job, waits for every rank's
count, gathers their records and writes ``manifest.json``. Each rank logs to ``logs/rank-<r>.log``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import PIL.Image
import torch
from tqdm.auto import tqdm

from components import ComponentsManager
from modular.batch.entries import BatchEntry, BatchJob
from modular.batch.job_values import OFFLOADS
from modular.batch.jobfile import JobFileError, WorkflowSpec
from modular.batch.jobs import JobRunner, call_job
from modular.batch.ranks import RankGroup, RankInfo, split_entries
from modular.batch.store import (
    LOGS,
    OutputStore,
    check_name_lengths,
    check_writable,
    encode,
    library_versions,
)
from modular.families import family_for_index
from modular.pipeline.index import read_index
from modular.pipeline.pipeline import ModularPipeline
from offload.devices.budget import BudgetedDevice
from offload.devices.simulated import SimulatedDevice
from offload.devices.units import parse_bytes

__all__ = [
    "BatchOptions",
    "BatchPlan",
    "BatchResult",
    "check_batch",
    "enable_offload",
    "plan_batch",
    "redo_lines",
    "run_batch",
]

_CUDA_MARGIN = "3GB"  # the engine's default: room for activations on a real device
_SIM_NEEDS_BUDGET = "offload 'sim' needs a budget: the simulated device's size in bytes, e.g. --budget 8GB"


def _offload(instance: BatchOptions, attribute: Any, value: str) -> None:
    if value not in OFFLOADS:
        msg = f"offload must be one of {list(OFFLOADS)} (got {value!r})"
        raise ValueError(msg)
    if value == "sim" and instance.budget is None:
        raise ValueError(_SIM_NEEDS_BUDGET)


@attrs.frozen
class BatchOptions:
    """How each rank runs: ``offload`` ``none`` (every model on the rank's device), ``auto`` (auto offload
    onto ``cuda:LOCAL_RANK``) or ``sim`` (auto offload onto a simulated device of ``budget`` bytes);
    ``budget``/``margin`` in bytes; ``progress``: rank 0's bar (``None``: on a terminal only)."""

    offload: str = attrs.field(default="none", validator=_offload)
    budget: int | None = None
    margin: int | None = None
    progress: bool | None = None


@attrs.frozen
class BatchPlan:
    """What a run would do: the finished entries (their sidecars), the rest and each rank's share, per
    workflow the components its pipeline loads, as ``(name, class name, load ID)``, and why each output
    found but not kept (damaged, or made from another entry or input image) is made again."""

    job: BatchJob
    finished: Mapping[int, Mapping[str, Any]]
    pending: tuple[BatchEntry, ...]
    shares: tuple[tuple[BatchEntry, ...], ...]
    components: Mapping[str, tuple[tuple[str, str, str], ...]]
    redo: Mapping[int, str] = attrs.field(factory=dict)


@attrs.frozen
class BatchResult:
    """One rank's run: the entries it ran; on rank 0 also the job's totals and the manifest."""

    info: RankInfo
    ran: tuple[int, ...]
    earlier: int
    total_ran: int
    seconds: float
    manifest: Path | None


def _check_workflow(spec: WorkflowSpec, source: str) -> None:
    """A named workflow the repo's family lacks is refused here, naming the repo and the family's workflows."""
    if spec.workflow is None:
        return
    _, index = read_index(spec.repo_path, revision=spec.revision)
    family = family_for_index(index, spec.repo)
    try:
        available = list(family.blocks_for(index)().available_workflows)
    except NotImplementedError:
        available = []
    if spec.workflow not in available:
        msg = (
            f"workflow {spec.name!r}: {spec.repo!r} is a {family.name} repo, whose blocks have no workflow "
            f"{spec.workflow!r} (available: {', '.join(available) or 'none named'})"
        )
        raise JobFileError(source, [msg])


def _images(spec: WorkflowSpec, source: str) -> dict[str, PIL.Image.Image]:
    images = {}
    for key, path in spec.image_paths.items():
        if not path.is_file():
            msg = f"{source}: workflow {spec.name!r}: image {key!r} {spec.images[key]!r} does not exist (looked for {path})"
            raise FileNotFoundError(msg)
        with PIL.Image.open(path) as opened:
            images[key] = opened.convert("L" if "mask" in key else "RGB")
    return images


def _first_entries(job: BatchJob) -> dict[str, BatchEntry]:
    first: dict[str, BatchEntry] = {}
    for entry in job.entries:
        first.setdefault(entry.workflow.name, entry)
    return first


def check_batch(
    job: BatchJob, manager: ComponentsManager | None = None
) -> tuple[dict[str, ModularPipeline], dict[str, dict[str, PIL.Image.Image]]]:
    """Bind each workflow's pipeline and check its inputs (``JobRunner.bind``); no weights are loaded.

    Returns the pipelines and the images each workflow reads, by workflow name.

    Raises:
        JobFileError: a workflow the repo's family lacks. FileNotFoundError: a repo or image that does not
        exist. MissingInputError, UnknownInputError, InputTypeError: inputs the pipeline does not take.
    """
    source = job.spec.source
    images = {}
    for spec in job.spec.workflows:
        _check_workflow(spec, source)
        images[spec.name] = _images(spec, source)
    on_cuda = torch.cuda.is_available()
    first = _first_entries(job)
    jobs = [attrs.evolve(entry.job(images[name], on_cuda), name=name) for name, entry in first.items()]
    pipes = JobRunner(manager or ComponentsManager(), progress=False).bind(jobs)
    return dict(zip(first, pipes)), images


def _components(pipe: ModularPipeline) -> tuple[tuple[str, str, str], ...]:
    rows = []
    for name in pipe.pretrained_component_names:
        spec = pipe.get_component_spec(name)
        if spec.pretrained_model_name_or_path:
            rows.append((name, spec.type_hint.__name__ if spec.type_hint else "?", str(spec.load_id)))
    return tuple(rows)


def _check_output(job: BatchJob) -> None:
    """The output folder takes files, and every entry's file names (temporary ones too) fit its file system."""
    check_writable(job.output)
    check_name_lengths(job.entries, job.output, job.spec.format, job.spec.source)


def redo_lines(job: BatchJob, redo: Mapping[int, str]) -> list[str]:
    """One line per output found but not kept: the entry, its name, and why it is made again."""
    return [f"entry {i} {job.entries[i].name}: {reason}; it runs again" for i, reason in sorted(redo.items())]


def plan_batch(job: BatchJob, world_size: int = 1) -> BatchPlan:
    """What ``run_batch`` would run on ``world_size`` ranks, without loading or writing anything."""
    _check_output(job)
    pipes, _ = check_batch(job)
    finished, redo = OutputStore(job.output, job.spec.format).resume(job.entries)
    pending = tuple(entry for entry in job.entries if entry.index not in finished)
    shares = tuple(tuple(split_entries(pending, rank, world_size)) for rank in range(world_size))
    components = {name: _components(pipe) for name, pipe in pipes.items()}
    return BatchPlan(job, finished, pending, shares, components, redo)


def enable_offload(
    manager: ComponentsManager,
    offload: str,
    device: torch.device,
    budget: int | None = None,
    margin: int | None = None,
    host_budget: int | None = None,
    bandwidth: int | str | None = None,
) -> str:
    """Turn on auto offload as ``modular batch`` and ``modular serve`` ask for it; returns where models run,
    in words.

    Args:
        manager: The manager whose models auto offload places.
        offload: ``none`` (models stay where the caller puts them, on ``device``; the budgets are unused),
            ``auto`` (auto offload onto ``device``, a CUDA device, limited to ``budget`` bytes when given) or
            ``sim`` (onto a simulated device of ``budget`` bytes).
        device: The process's device (``cuda:LOCAL_RANK``, or the CPU without CUDA).
        budget, margin: Device bytes the weights may use and bytes kept free (default 3GB on CUDA, 0 on a
            simulated device).
        host_budget: Host bytes the host copies may use (``None``: what the host has available).
        bandwidth: ``sim`` only: the simulated device's host-to-device bytes per second (or ``"100MB/s"``);
            its moves then take their time on the wall clock (``SimulatedDevice(real_time=True)``).

    Raises:
        ValueError: an unknown ``offload``, ``sim`` without a budget, ``auto`` without CUDA, a bad bandwidth, or
            a bandwidth without ``sim``.
    """
    if offload not in OFFLOADS:
        msg = f"offload must be one of {list(OFFLOADS)} (got {offload!r})"
        raise ValueError(msg)
    if bandwidth is not None and offload != "sim":
        raise ValueError(f"a bandwidth is for a simulated device (offload 'sim'; got offload {offload!r})")
    if offload == "none":
        return str(device)
    if offload == "sim":
        if budget is None:
            raise ValueError(_SIM_NEEDS_BUDGET)
        target: Any = SimulatedDevice(budget, h2d_bandwidth=bandwidth, real_time=bandwidth is not None)
        default_margin = 0
    else:
        if device.type != "cuda":
            msg = f"offload 'auto' moves models onto CUDA, but this process's device is {device}; use 'sim' with a budget"
            raise ValueError(msg)
        target = str(device) if budget is None else BudgetedDevice(device, budget)
        default_margin = parse_bytes(_CUDA_MARGIN)
    manager.enable_auto_cpu_offload(
        device=target,
        memory_reserve_margin=default_margin if margin is None else margin,
        host_budget=host_budget,
    )
    return f"{device if offload == 'auto' else 'a simulated device'} under auto offload"


@contextlib.contextmanager
def _rank_log(folder: Path, info: RankInfo, run_id: str) -> Iterator[logging.Logger]:
    """This rank's log file, ``logs/rank-<r>.log`` (appended to by every run)."""
    (folder / LOGS).mkdir(parents=True, exist_ok=True)
    log = logging.getLogger(f"{__name__}.rank{info.rank}")
    handler = logging.FileHandler(folder / LOGS / f"rank-{info.rank}.log")
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {info.rank} run {run_id}: %(message)s"))
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield log
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class _Worker:
    """One rank's part: loads each workflow's components when first needed, runs and writes its entries."""

    def __init__(self, job: BatchJob, pipes: dict, images: dict, manager: ComponentsManager, info: RankInfo):
        self.job, self.pipes, self.images, self.info = job, pipes, images, info
        self.runner = JobRunner(manager, progress=False)
        self.on_cuda = info.device.type == "cuda"
        self.loaded: set[str] = set()

    def pipe_for(self, entry: BatchEntry, offload: bool, log: logging.Logger) -> ModularPipeline:
        name = entry.workflow.name
        pipe = self.pipes[name]
        if name not in self.loaded:
            loaded, reused = self.runner.load(entry.job(self.images[name], self.on_cuda), pipe)
            if not offload and self.on_cuda:
                pipe.to(self.info.device)
            pipe.set_progress_bar_config(disable=True)
            self.loaded.add(name)
            log.info(
                f"loaded {name}: {', '.join(loaded) or 'nothing'}; reused: {', '.join(reused) or 'nothing'}"
            )
        return pipe

    def run(self, entry: BatchEntry, pipe: ModularPipeline) -> tuple[bytes, float]:
        started = time.perf_counter()
        images = call_job(pipe, entry.job(self.images[entry.workflow.name], self.on_cuda))
        return encode(images, self.job.spec.format), time.perf_counter() - started


def _record(run_id: str, info: RankInfo, where: str, seconds: float, versions: dict) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 4),
        "rank": info.rank,
        "world_size": info.world_size,
        "device": where,
        "run": run_id,
        "finished": _now(),
        "versions": versions,
    }


def _bar(total: int, initial: int, info: RankInfo, progress: bool | None) -> Any:
    """Rank 0's bar for the whole job (other ranks: a disabled one)."""
    disable = True if info.rank != 0 or progress is False else (None if progress is None else False)
    return tqdm(total=total, initial=initial, unit="image", desc="batch", disable=disable)


def run_batch(
    job: BatchJob,
    options: BatchOptions | None = None,
    info: RankInfo | None = None,
    report: Callable[[str], Any] | None = None,
) -> BatchResult:
    """Run a batch job on this rank (all of it without a launcher); see the module docstring.

    Args:
        job: The job (``load_job``).
        options: Offload and progress (``BatchOptions()``: models on the rank's device, a bar on a terminal).
        info: This process's rank (``RankInfo.from_env()``).
        report: Called on rank 0 with a line before the run and one after it (the command line prints them).

    Raises:
        PermissionError: the output folder cannot be written. JobFileError and the errors of
        ``check_batch``: all before any model loads.
    """
    options = options or BatchOptions()
    info = info or RankInfo.from_env()
    say = report if report is not None and info.rank == 0 else (lambda line: None)
    started = time.perf_counter()
    _check_output(job)
    manager = ComponentsManager()
    pipes, images = check_batch(job, manager)
    where = enable_offload(manager, options.offload, info.device, options.budget, options.margin)
    store = OutputStore(job.output, job.spec.format, tag=f"{info.rank}-{os.getpid()}")
    versions = library_versions()
    worker = _Worker(job, pipes, images, manager, info)
    with RankGroup(info) as group:
        earlier: dict[int, Any] = {}
        redo: dict[int, str] = {}
        run_id = ""
        if info.rank == 0:  # one rank decides what is left, before any rank writes
            store.remove_partial_files()
            earlier, redo = store.resume(job.entries)
            run_id = f"{datetime.datetime.now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
        run_id, finished = group.broadcast((run_id, sorted(earlier)))
        group.start_counting(run_id)
        done = set(finished)
        pending = [entry for entry in job.entries if entry.index not in done]
        order = {spec.name: number for number, spec in enumerate(job.spec.workflows)}
        mine = split_entries(pending, info.rank, info.world_size)
        mine.sort(key=lambda entry: (order[entry.workflow.name], entry.index))  # fewer pipeline switches
        plural = "s" if info.world_size > 1 else ""
        for line in redo_lines(job, redo):
            say(line)
        say(
            f"{job.spec.source}: {len(job)} entries, {len(done)} done earlier, {len(pending)} to run on "
            f"{info.world_size} rank{plural} ({where}) -> {job.output}"
        )
        records: dict[int, dict[str, Any]] = {}
        with (
            _rank_log(job.output, info, run_id) as log,
            _bar(len(job), len(done), info, options.progress) as bar,
        ):
            for line in redo_lines(job, redo):
                log.info(line)
            log.info(f"{len(mine)} of {len(pending)} entries to run ({len(done)} done earlier) on {where}")

            def progress(count: int) -> None:
                bar.update(len(done) + count - bar.n)

            try:
                for entry in mine:
                    pipe = worker.pipe_for(entry, options.offload != "none", log)
                    data, seconds = worker.run(entry, pipe)
                    records[entry.index] = store.write(
                        entry, data, _record(run_id, info, where, seconds, versions)
                    )
                    log.info(f"ran {entry.index} {entry.name} seed={entry.seed} in {seconds:.3f} s")
                    progress(group.count())
            except BaseException as error:
                group.fail(f"{type(error).__name__}: {error}")
                raise
            group.wait_for(len(pending), progress)
            log.info(f"finished: ran {len(records)} entries")
        keep = ("run", "rank", "seconds")
        gathered = group.gather({i: {k: record[k] for k in keep} for i, record in records.items()})
    manifest = None
    total_ran = len(records)
    if gathered is not None and info.rank == 0:
        ran = {index: record for part in gathered for index, record in part.items()}
        total_ran = len(ran)
        head = {
            "job": job.spec.source,
            "output": str(job.output),
            "seed": job.spec.seed,
            "format": job.spec.format,
            "run": run_id,
            "world_size": info.world_size,
            "finished": _now(),
            "seconds": round(time.perf_counter() - started, 3),
            "ran": total_ran,
            "earlier": len(done),
            "versions": versions,
        }
        manifest = store.write_manifest(store.manifest(job.entries, earlier, ran, head))
    seconds = time.perf_counter() - started
    rate = f", {total_ran / seconds:.2f} images/s" if total_ran else ""
    say(f"ran {total_ran} entries in {seconds:.1f} s{rate} ({len(done)} done earlier); wrote {manifest}")
    return BatchResult(info, tuple(sorted(records)), len(done), total_ran, seconds, manifest)
