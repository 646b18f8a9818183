"""``modular run``: the built-in scenario, a family's tiny repo, or any repos, on one manager.

Jobs come from the command line: ``modular run REPO [options] --then REPO_B [options] ...`` makes one job
per repo, all on one ``ComponentsManager`` (so what they share is loaded once) under one auto offload.
A job after ``--then`` keeps the previous job's text and number options (prompt, negative prompt,
steps, seed, size, guidance, number of images, dtype) unless it sets them; its workflow, images,
variant, revision and ``--reuse`` (components taken from the previous job instead of loaded) are its
own. Options of the whole run (``--offload``, ``--budget``, ``--margin``, ``--output``, ``--quiet``)
come before the first ``--then``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import PIL.Image
import torch

from components import ComponentsManager
from modular.batch.job_values import DTYPE_NAMES
from modular.batch.jobs import Demo, Job, JobResult, JobRunner
from modular.batch.output_folder import unwritable_reason
from modular.cli import report as cli_report
from modular.cli.arg_types import byte_size, positive_int, seed_number
from modular.cli.args import DEFAULT_FAMILY, DEFAULT_PROMPT, add_job_arguments
from modular.cli.inspect_command import fit_lines
from modular.families import BlockFamily, available_families, family_for_index
from modular.pipeline.index import read_index
from offload.devices.budget import BudgetedDevice
from offload.devices.probes import resolve_probe
from offload.devices.simulated import SimulatedDevice
from offload.devices.units import parse_bytes
from offload.engine.replay import UseRecorder
from offload.strategies.strategy import strategy_name

__all__ = [
    "RunOutcome",
    "add_job_arguments",
    "byte_size",
    "family_named",
    "positive_int",
    "run_command",
    "seed_number",
    "tiny_repo",
]

INPUT_FLAGS = {
    "prompt": "--prompt TEXT",
    "image": "--image PATH",
    "mask_image": "--mask PATH",
    "control_image": "--control-image PATH",
}
INHERITED = (
    "prompt",
    "negative_prompt",
    "steps",
    "seed",
    "height",
    "width",
    "guidance_scale",
    "num_images",
    "dtype",
)
# A job's own options: not inherited by the jobs after it, and not taken by the built-in scenario.
_REPO_OWN = ("workflow", "image", "mask", "control_image", "variant", "revision", "reuse")
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
_REAL_DEVICE_MARGIN = "3GB"  # the engine's default: room for activations on a real device


@attrs.frozen
class RunOutcome:
    """What one ``modular run`` did: the results, the recorded uses (with offload on), the files."""

    manager: ComponentsManager
    results: tuple[JobResult, ...]
    recorder: UseRecorder | None
    saved: tuple[Path, ...]


def _image(flag: str, path: str, mode: str = "RGB") -> PIL.Image.Image:
    file = Path(path)
    if not file.is_file():
        what = "is a folder, not an image file" if file.is_dir() else "does not exist"
        msg = f"{flag}: {path!r} {what}"
        raise FileNotFoundError(msg)
    try:
        with PIL.Image.open(file) as opened:
            return opened.convert(mode)
    except (PIL.UnidentifiedImageError, OSError) as error:
        msg = f"{flag}: {path!r} is not an image PIL can read ({type(error).__name__})"
        raise ValueError(msg) from None


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """Call inputs from one job's options; what was not given is left to the pipeline."""
    inputs: dict[str, Any] = {}
    for key, name in (
        ("prompt", "prompt"),
        ("negative_prompt", "negative_prompt"),
        ("steps", "num_inference_steps"),
        ("height", "height"),
        ("width", "width"),
        ("guidance_scale", "guidance_scale"),
        ("num_images", "num_images_per_prompt"),
    ):
        if getattr(args, key, None) is not None:
            inputs[name] = getattr(args, key)
    for flag, key, name, mode in (
        ("--image", "image", "image", "RGB"),
        ("--mask", "mask", "mask_image", "L"),
        ("--control-image", "control_image", "control_image", "RGB"),
    ):
        if getattr(args, key, None) is not None:
            inputs[name] = _image(flag, getattr(args, key), mode)
    return inputs


def family_named(name: str) -> BlockFamily:
    """The installed family of this name.

    Raises:
        ValueError: no such family (the message lists the installed ones).
    """
    families = available_families()
    if name not in families:
        close = difflib.get_close_matches(name, list(families), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        msg = f"unknown family {name!r}{hint}; installed families: {sorted(families)}"
        raise ValueError(msg)
    return families[name]


def tiny_repo(family: BlockFamily, folder: Path) -> Path:
    """Write the family's tiny repo into ``folder``."""
    if family.make_tiny_repo is None:
        msg = f"family {family.name!r} ships no tiny-repo builder; give a REPO"
        raise ValueError(msg)
    return Path(family.make_tiny_repo(folder))


def _family_of(repo: str, revision: str | None) -> BlockFamily:
    _, index = read_index(repo, revision=revision)
    return family_for_index(index, repo)


def _per_prompt_count(inputs: dict[str, Any], repo: str, revision: str | None) -> dict[str, Any]:
    """`inputs` with --num-images under the name the repo's blocks take: ``num_videos_per_prompt`` for a
    video family's (Wan), ``num_images_per_prompt`` otherwise."""
    if "num_images_per_prompt" not in inputs:
        return inputs
    _, index = read_index(repo, revision=revision)
    blocks = family_for_index(index, repo).blocks_for(index)()
    if "num_images_per_prompt" in blocks.input_names or "num_videos_per_prompt" not in blocks.input_names:
        return inputs
    renamed = {key: value for key, value in inputs.items() if key != "num_images_per_prompt"}
    return {**renamed, "num_videos_per_prompt": inputs["num_images_per_prompt"]}


def _repo_jobs(
    first: argparse.Namespace, repo: str, thens: Sequence[argparse.Namespace], dtype: torch.dtype
) -> list[Job]:
    jobs: list[Job] = []
    previous = first
    for number, args in enumerate([first, *thens], start=1):
        for key in INHERITED:
            if getattr(args, key) is None:
                setattr(args, key, getattr(previous, key))
        previous = args
        job_repo = repo if number == 1 else args.repo
        _family_of(job_repo, args.revision)  # an unknown class or a damaged index is refused before any load
        stem = cli_report.repo_stem(job_repo)
        name = stem if args.workflow is None else f"{stem}-{args.workflow}"
        name = name if name not in {job.name for job in jobs} else f"{name}-{number}"
        inputs = _per_prompt_count({"prompt": DEFAULT_PROMPT, **_inputs(args)}, job_repo, args.revision)
        load = {"torch_dtype": DTYPES.get(args.dtype or "", dtype)}
        if args.variant:
            load["variant"] = args.variant
        seed = 0 if args.seed is None else args.seed
        reuse = args.reuse or ()
        jobs.append(
            Job(
                name,
                job_repo,
                args.workflow,
                inputs,
                seed,
                load_options=load,
                revision=args.revision,
                reuse=reuse,
            )
        )
    return jobs


def _demo_jobs(args: argparse.Namespace, demo: Demo) -> list[Job]:
    """The demo's jobs with the options given on the command line in place of its own."""
    own = [f"--{key.replace('_', '-')}" for key in _REPO_OWN if getattr(args, key) is not None]
    if own:
        msg = f"the built-in scenario takes no {', '.join(own)} (it makes its own inputs); give a REPO to use them"
        raise ValueError(msg)
    given = _inputs(args)
    load = {"torch_dtype": DTYPES.get(args.dtype or "", torch.float32)}
    return [
        attrs.evolve(
            job,
            inputs={**job.inputs, **given},
            seed=job.seed if args.seed is None else args.seed,
            load_options={**job.load_options, **load},
        )
        for job in demo.jobs
    ]


def _device(args: argparse.Namespace, demo: Demo | None) -> tuple[Any, int, int | None, str]:
    """``(device for enable_auto_cpu_offload or None, margin, budget or None, description)``."""
    kind = args.offload.lower()
    budget = args.budget if args.budget is not None else (demo.budget if demo else None)
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else ("sim" if budget is not None else "none")
    if kind in ("none", "off", "cpu"):
        if args.budget is not None:
            msg = f"--budget needs auto offload, which --offload {args.offload} turns off; drop one of them"
            raise ValueError(msg)
        return None, 0, None, "off"
    simulated = kind in ("sim", "simulated")
    margin = args.margin
    if margin is None:
        margin = demo.margin if demo else (0 if simulated else parse_bytes(_REAL_DEVICE_MARGIN))
    if simulated:
        if budget is None:
            msg = "--offload sim needs --budget: the simulated device's size, e.g. --budget 8GB"
            raise ValueError(msg)
        return SimulatedDevice(budget), margin, budget, "a simulated device"
    try:
        probe = resolve_probe(kind)  # an unknown or absent device is refused here, before anything loads
    except ValueError as error:  # its message names the Python API; say what to type here
        msg = f"--offload {kind}: {error} On the command line: --offload sim --budget 8GB simulates a device"
        raise ValueError(msg) from None
    if budget is not None:
        return (
            BudgetedDevice(probe.execution_device, budget),
            margin,
            budget,
            f"{probe.name} (budget-limited)",
        )
    return probe, margin, None, probe.name


@contextlib.contextmanager
def _recording(manager: ComponentsManager):
    engine = manager.offload_engine
    if engine is None:
        yield None
        return
    with UseRecorder(engine) as recorder:
        yield recorder


def _plan(args: argparse.Namespace, thens: Sequence[argparse.Namespace], scratch: Path):
    """``(jobs, demo or None, whether the repos are built-in tiny ones)`` for this command line."""
    repo = args.repo or args.repo_flag
    if args.repo and args.repo_flag:
        msg = f"give the repo once: REPO ({args.repo!r}) or --repo ({args.repo_flag!r})"
        raise ValueError(msg)
    if repo is None and thens:
        msg = "--then starts the next job: give a REPO before it (modular run REPO ... --then REPO_B ...)"
        raise ValueError(msg)
    if repo is not None:
        on_cuda = (
            args.offload.lower() not in ("none", "off", "cpu", "sim", "simulated")
            and torch.cuda.is_available()
        )
        jobs = _repo_jobs(args, repo, thens, torch.bfloat16 if on_cuda else torch.float32)
        return jobs, None, False
    if args.family is None and args.out is None:
        make_demo = next(
            (f.demo for _, f in sorted(available_families().items()) if f.demo is not None), None
        )
        if make_demo is None:
            msg = "no installed family ships a built-in scenario; give a REPO (modular run REPO)"
            raise ValueError(msg)
        demo = make_demo(scratch)
        return _demo_jobs(args, demo), demo, True
    # A family's tiny repo (--family, or the older --out spelling): one image, as before the scenario.
    family = family_named(args.family or DEFAULT_FAMILY)
    args.steps = 2 if args.steps is None else args.steps
    job = _repo_jobs(args, str(tiny_repo(family, scratch / "tiny-repo")), [], torch.float32)[0]
    return [attrs.evolve(job, inputs={**family.tiny_repo_inputs, **job.inputs})], None, True


def run_command(
    args: argparse.Namespace, thens: Sequence[argparse.Namespace], out: Callable[[str], Any] = print
) -> RunOutcome:
    """Run the jobs of one command line, printing a table after each and a summary at the end."""
    width = shutil.get_terminal_size().columns
    folder = Path(args.output or args.out or "out")
    problem = unwritable_reason(folder)  # before anything loads: a run must not end unable to save
    if problem is not None:
        flag = "--out" if args.out and not args.output else "--output"
        msg = f"{flag}: cannot write the images into {str(folder)!r} ({problem}); give {flag} a folder you can write"
        raise NotADirectoryError(msg) if "not a folder" in problem else PermissionError(msg)
    with tempfile.TemporaryDirectory(prefix="modular-run-") as scratch:
        jobs, demo, tiny = _plan(args, thens, Path(scratch))
        if tiny:
            # Tiny models gain nothing from threads, and on a busy machine OpenMP threads spinning against
            # other processes make each call many times slower (the scenario: about 3 s against 20 s).
            torch.set_num_threads(1)
        device, margin, budget, device_text = _device(args, demo)
        manager = ComponentsManager()
        if demo is not None:
            out(demo.title)
            out(demo.about)
            out("")
        if device is not None:
            manager.enable_auto_cpu_offload(device=device, memory_reserve_margin=margin)
            engine = manager.offload_engine
            strategy = "none" if engine is None else strategy_name(engine.strategy)
            unit = cli_report.unit_for(budget or margin or 1)
            size = f", budget {cli_report.size_text(budget, unit)}" if budget is not None else ""
            out(
                f"Auto offload on {device_text}{size}, margin {cli_report.size_text(margin, unit)};\n"
                f"strategy {strategy}.\n"
            )
        runner = JobRunner(manager, progress=False if args.quiet else None, input_flags=INPUT_FLAGS)
        results, saved = [], []
        with _recording(manager) as recorder:
            for number, result in enumerate(runner.run(jobs), start=1):
                results.append(result)
                # The header's list of components wraps to the width; paths and tables are never split.
                out(
                    "\n".join(
                        fit_lines(cli_report.job_header(number, len(jobs), result), width, split_words=False)
                    )
                )
                if getattr(args, "table", True):
                    out(result.table)
                out("")
                saved += cli_report.save_job(
                    result, folder, result.job.name, overwrite=getattr(args, "overwrite", False)
                )
        if recorder is not None:
            engine = recorder.engine  # the manager's engine, whose uses were recorded
            if budget is None:  # a device of unknown size: its peak stands in for the budget
                budget = engine.probe.total_bytes() or engine.peak_resident_bytes
            out("\n".join(cli_report.offload_summary(manager, recorder, budget, margin)))
            out("")
            plot = cli_report.save_plot(manager, recorder, results, folder, budget, margin, device_text)
            if plot is None:
                out("no memory plot: matplotlib is not installed (pip install 'modular-pipelines[plot]')")
            else:
                saved.append(plot)
        for path in saved:
            kept = " (a file of that name was there and stays; --overwrite replaces it)"
            out(f"saved {path}" + (kept if cli_report.numbered(path) else ""))
    return RunOutcome(manager, tuple(results), recorder, tuple(saved))
