"""Jobs: several pipeline runs on one ComponentsManager, as ``modular run`` makes them.

A ``Job`` is one pipeline call on one repo; a ``Demo`` is a family's built-in scenario (its jobs and
the device budget that shows what it is about). ``JobRunner`` binds every job first (index files
read, inputs checked, nothing loaded), then loads and runs them in order, each through
``ModularPipeline.from_pretrained(repo, components_manager=manager)``, so components with the same
load ID are loaded once and shared.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from tqdm.auto import tqdm

from components import ComponentsManager
from modular.batch.job_values import MAX_SEED, seed_problem
from modular.batch.step_lines import StepLines, is_terminal
from modular.errors import MissingInputError, UnknownInputError
from modular.framework.planning import check_inputs, known_inputs
from modular.pipeline.pipeline import ModularPipeline
from modular.watch.keywords import call_watch_of

__all__ = [
    "MAX_SEED",
    "Demo",
    "Job",
    "JobResult",
    "JobRunner",
    "call_job",
    "check_job_inputs",
    "seed_problem",
]

Derive = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]


def _mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    return dict(values)


def _names(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class Job:
    """One pipeline call on one repo.

    Attributes:
        name: Names the job in the output (files, tables, the plot) and the manager collection its
            pipeline uses; unique within a run.
        repo: A local folder or a hub repo id.
        workflow: Prune the blocks to this named workflow (``None``: the repo's, else all).
        inputs: Call inputs (``prompt``, ``num_inference_steps``, images...), without ``generator``.
        seed: Seed of the CPU generator passed as ``generator``; ``None`` passes none.
        derive: ``derive(images by job name) -> inputs``: inputs made from earlier jobs' images (each an
            ``[N, H, W, 3]`` float array in [0, 1]), e.g. a control image from a text-to-image result.
        derives: The names of the inputs ``derive`` returns, so they are checked before anything runs.
        load_options: Keywords of ``load_components`` (``torch_dtype``, ``variant``).
        revision: The repo revision (branch, tag or commit) for hub repos.
        reuse: Components taken from the previous job's pipeline instead of loaded from this repo (for
            repos that ship their own copies of shared models, as the FLUX.1 control repos do).
    """

    name: str
    repo: str
    workflow: str | None = None
    inputs: Mapping[str, Any] = attrs.field(factory=dict, converter=_mapping)
    seed: int | None = 0
    derive: Derive | None = None
    derives: tuple[str, ...] = attrs.field(default=(), converter=_names)
    load_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_mapping)
    revision: str | None = None
    reuse: tuple[str, ...] = attrs.field(default=(), converter=_names)


def _jobs(values: Sequence[Job]) -> tuple[Job, ...]:
    return tuple(values)


@attrs.frozen
class Demo:
    """A family's built-in scenario: what ``modular run`` runs when no repo is given.

    Attributes:
        title: One line saying what it shows.
        about: A few lines on what to look for in the output.
        jobs: The pipeline calls, in order.
        budget: Bytes of the simulated device that makes the scenario's evictions happen.
        margin: Bytes the engine keeps free on it.
    """

    title: str
    jobs: tuple[Job, ...] = attrs.field(converter=_jobs)
    budget: int
    margin: int = 0
    about: str = ""


@attrs.frozen
class JobResult:
    """One job after it ran.

    Attributes:
        job: The job.
        pipeline: Its pipeline (components loaded).
        images: The output, ``[N, H, W, 3]`` float32 in [0, 1]; a video family's (one that outputs ``videos``)
            ``[N, frames, H, W, 3]``.
        derived: The inputs ``job.derive`` made.
        loaded: Component names this job loaded; ``reused``: those the manager held already.
        started, finished: ``time.perf_counter()`` around the pipeline call (loading is before it).
        table: ``str(manager)`` right after the call.
    """

    job: Job
    pipeline: ModularPipeline
    images: np.ndarray
    derived: dict[str, Any]
    loaded: tuple[str, ...]
    reused: tuple[str, ...]
    started: float
    finished: float
    table: str


class JobRunner:
    """Runs jobs in order on one manager.

    Args:
        manager: The manager every pipeline loads through.
        progress: Progress of loading and denoising: ``None`` a bar on a terminal and, when stderr is not a
            terminal (a CI log, ``2>log``), a line now and then (``modular/batch/step_lines.py``); ``False``
            nothing; ``True`` a bar always. Bars are cleared when they finish.
        input_flags: How the caller names inputs (``{"control_image": "--control-image PATH"}``),
            for the message about a missing input.
        cancel: A ``threading.Event`` or ``modular.CancelToken`` every job's pipeline call watches: once set,
            the call in progress raises ``modular.CallCancelled`` before its next block or step, and no later
            job runs (``pipe(..., cancel=)``, docs/callbacks.md).

    Raises:
        TypeError: ``cancel`` has no ``is_set()``.
    """

    def __init__(
        self,
        manager: ComponentsManager,
        progress: bool | None = None,
        input_flags: Mapping[str, str] | None = None,
        cancel: Any = None,
    ):
        call_watch_of(cancel=cancel)  # checked now, not after the first job's models load
        self.manager = manager
        self._progress = progress
        self._flags = dict(input_flags or {})
        self._cancel = cancel

    def bind(self, jobs: Sequence[Job]) -> list[ModularPipeline]:
        """Make each job's pipeline (index files read, no weights) and check its inputs.

        Raises:
            ValueError: two jobs share a name.
            MissingInputError: a job lacks an input its workflow requires.
            UnknownInputError, InputTypeError: an input the pipeline does not take or of the wrong type.
        """
        names = [job.name for job in jobs]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            msg = f"job names must be unique within a run (got {twice} more than once)"
            raise ValueError(msg)
        if jobs and jobs[0].reuse:
            msg = f"job {jobs[0].name!r} reuses {list(jobs[0].reuse)}, but it is the first job: nothing ran before it"
            raise ValueError(msg)
        return [self._bind(job) for job in jobs]

    def _bind(self, job: Job) -> ModularPipeline:
        pipe = ModularPipeline.from_pretrained(
            job.repo,
            components_manager=self.manager,
            collection=job.name,
            workflow=job.workflow,
            revision=job.revision,
        )
        unknown = [name for name in job.reuse if name not in pipe.component_names]
        if unknown:
            msg = f"{job.repo}: job {job.name!r} reuses {unknown}, which its pipeline does not have (it has {pipe.component_names})"
            raise KeyError(msg)
        check_job_inputs(pipe, job, self._flags)
        return pipe

    def run(self, jobs: Sequence[Job]) -> Iterator[JobResult]:
        """Bind every job (see ``bind``), then load and run them in order, yielding each result."""
        pipes = self.bind(jobs)
        done: dict[str, np.ndarray] = {}
        for number, (job, pipe) in enumerate(zip(jobs, pipes)):
            if job.reuse:
                previous = pipes[number - 1]
                pipe.update_components(**{name: getattr(previous, name) for name in job.reuse})
            result = self._run(job, pipe, done, f"job {number + 1}/{len(jobs)} {job.name}")
            done[job.name] = result.images
            yield result

    def _bar(self, job: Job, what: str, unit: str, line_label: str | None) -> dict[str, Any]:
        """The options of a bar (tqdm's, and ``tqdm_class``) for the job's ``what`` (``loading``, ``denoising``):
        a bar on a terminal, lines labelled ``line_label`` elsewhere, nothing when progress is off."""
        if self._progress is False:
            return {"disable": True}
        if self._progress is None and not is_terminal(sys.stderr):
            return {"tqdm_class": StepLines, "desc": line_label or f"{job.name}: {what}"}
        return {"desc": f"{job.name}: {what}", "unit": unit, "leave": False, "disable": False}

    def load(
        self, job: Job, pipe: ModularPipeline, label: str | None = None
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Load the job's components into ``pipe`` (those it reuses excepted); returns
        ``(names this loaded, names the manager or the previous job held already)``. ``label`` starts
        each progress line where stderr is not a terminal (``"job 1/3 tiny-flux-dev"``)."""
        names = [
            name
            for name in pipe.pretrained_component_names
            if pipe.get_component_spec(name).pretrained_model_name_or_path and name not in job.reuse
        ]
        before = set(self.manager.components)
        options = self._bar(job, "loading", "component", f"{label or job.name}: loaded")
        bar_class = options.pop("tqdm_class", tqdm)
        with bar_class(names, **options) as bar:
            for name in bar:
                bar.set_postfix_str(name)
                pipe.load_components([name], **job.load_options)
        loaded = [name for name in names if self.manager.get_id(getattr(pipe, name)) not in before]
        return tuple(loaded), tuple(name for name in (*job.reuse, *names) if name not in loaded)

    def _run(self, job: Job, pipe: ModularPipeline, done: Mapping[str, np.ndarray], label: str) -> JobResult:
        derived = dict(job.derive(done)) if job.derive is not None else {}
        loaded, reused = self.load(job, pipe, label)
        pipe.set_progress_bar_config(**self._bar(job, "denoising", "step", f"{label}: step"))
        started = time.perf_counter()
        images = call_job(pipe, job, derived, cancel=self._cancel)
        finished = time.perf_counter()
        return JobResult(
            job=job,
            pipeline=pipe,
            images=images,
            derived=derived,
            loaded=loaded,
            reused=reused,
            started=started,
            finished=finished,
            table=str(self.manager),
        )


def check_job_inputs(pipe: ModularPipeline, job: Job, input_flags: Mapping[str, str] | None = None) -> None:
    """Check ``job``'s inputs (and the names it derives) against ``pipe``'s blocks, before anything loads.

    Args:
        input_flags: How the caller names inputs, for the message about a missing one.

    Raises:
        MissingInputError: an input the workflow requires is not given.
        UnknownInputError, InputTypeError: an input the pipeline does not take or of the wrong type.
    """
    params = known_inputs(pipe.blocks)
    check_inputs(job.repo, params, dict(job.inputs), pipe.blocks)
    unknown = [name for name in job.derives if name not in params]
    if unknown:
        msg = f"{job.repo}: job {job.name!r} derives {unknown}, which its pipeline does not take"
        raise UnknownInputError(msg)
    given = {*job.inputs, *job.derives}
    missing = [
        p.name
        for p in pipe.blocks.inputs
        if p.required and p.default is None and p.name and p.name not in given
    ]
    if missing:
        where = f" (workflow {job.workflow!r})" if job.workflow else ""
        flags = input_flags or {}
        fix = ", ".join(flags.get(name, name) for name in missing)
        msg = f"{job.repo}{where} needs {', '.join(missing)}: pass {fix}"
        raise MissingInputError(msg)


VIDEOS = "videos"  # the output of a video family's blocks, [N, frames, H, W, 3] as numpy


def call_job(
    pipe: ModularPipeline,
    job: Job,
    extra: Mapping[str, Any] | None = None,
    cancel: Any = None,
    **watch: Any,
) -> np.ndarray:
    """Call ``pipe`` with the job's inputs (and ``extra``), a CPU generator seeded with ``job.seed`` and
    numpy output, watching ``cancel`` when one is given (and the other watching keywords of ``pipe(...)`` in
    ``watch``: ``on_progress``, ``preview_every``, ``on_preview``...); returns the images, ``[N, H, W, 3]``
    float32 in [0, 1], or for blocks that output ``videos`` (Wan) the videos, ``[N, frames, H, W, 3]``."""
    inputs = {**job.inputs, **(extra or {})}
    if job.seed is not None:
        inputs["generator"] = torch.Generator("cpu").manual_seed(job.seed)
    if "output_type" in known_inputs(pipe.blocks):
        inputs["output_type"] = "np"
    output = VIDEOS if VIDEOS in pipe.blocks.intermediate_output_names else "images"
    return _as_array(pipe(output=output, cancel=cancel, **watch, **inputs))


def _as_array(images: Any) -> np.ndarray:
    """``[N, H, W, 3]`` float32 in [0, 1] from an ``"np"`` output, a tensor or a list of PIL images."""
    if isinstance(images, torch.Tensor):
        images = images.float().permute(0, 2, 3, 1).cpu().numpy()
    if isinstance(images, np.ndarray):
        return images.astype(np.float32, copy=False)
    return np.stack([np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0 for image in images])
