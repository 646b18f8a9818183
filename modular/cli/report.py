"""What ``modular run`` prints and saves: per-job headers, the offload summary beside the peer's rule, files."""

from __future__ import annotations

import itertools
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image

from modular.batch.jobs import JobResult
from modular.batch.video import VIDEO_SUFFIX, export_video
from modular.cli.memory_plot import Band, matplotlib_available, plot_memory
from offload.devices.units import KiB, column_unit, format_in
from offload.engine.replay import ReplayResult, UseRecorder, replay
from offload.errors import ModelTooLargeError
from offload.strategies.smallest_set import SmallestSufficientSet
from offload.strategies.strategy import strategy_name

__all__ = ["job_header", "model_labels", "offload_summary", "save_job", "save_plot", "size_text"]

Print = Callable[[str], Any]
#: The run report's prose lines fit an 80-column terminal (the CLI wraps what a narrower one needs).
_PROSE_WIDTH = 78


def size_text(nbytes: int, unit: int) -> str:
    """``nbytes`` in ``unit`` (``GiB``, ``MiB``, ``KiB``: the IEC labels the table prints), two decimals."""
    return format_in(nbytes, unit)


def unit_for(nbytes: int) -> int:
    """The unit sizes up to ``nbytes`` read best in: GiB, MiB, else KiB."""
    return max(column_unit([nbytes]), KiB)


def _repo_name(repo: str) -> str:
    return Path(repo).name if Path(repo).is_dir() else repo


def repo_stem(repo: str) -> str:
    """What names a repo's outputs: a folder's name, or a hub id's name part (``FLUX.1-dev``)."""
    return Path(repo).name if Path(repo).is_dir() else repo.rstrip("/").rsplit("/", 1)[-1]


def job_header(number: int, total: int, result: JobResult) -> list[str]:
    """Two lines: the job, its repo, steps and time; what it loaded and what the manager already held."""
    job = result.job
    steps = job.inputs.get("num_inference_steps", result.derived.get("num_inference_steps"))
    default = steps is None
    if default:  # the number the blocks ran: their declared default
        steps = next(
            (p.default for p in result.pipeline.blocks.inputs if p.name == "num_inference_steps"), None
        )
    step_text = "default steps" if steps is None else f"{steps} step{'s' if steps != 1 else ''}"
    step_text += " (the default)" if default and steps is not None else ""
    seconds = result.finished - result.started
    return [
        f"[{number}/{total}] {job.name}: {_repo_name(job.repo)}, {step_text}, {seconds:.1f} s",
        f"      loaded: {', '.join(result.loaded) or 'nothing'}; reused: {', '.join(result.reused) or 'nothing'}",
    ]


def model_labels(manager: Any, uses: Sequence[Any]) -> dict[str, str]:
    """Legend text per model id, most often resident first: the component name, with its repo when
    several models share the name (three transformers: ``transformer (tiny-flux-canny-dev)``)."""
    resident = Counter(model for use in uses for model in use.resident)
    ids = sorted(resident, key=lambda model: -resident[model])
    names = {model: model.rsplit("_", 1)[0] for model in ids}
    counts = Counter(names.values())
    labels = {}
    for model in ids:
        label = names[model]
        if counts[label] > 1 and model in manager:
            load_id = manager.get_model_info(model, "load_id")["load_id"] or ""
            label = f"{label} ({_repo_name(load_id.split('|')[0])})"
        labels[model] = label
    return labels


def _prose(text: str) -> list[str]:
    """``text`` wrapped to the report's width, indented two spaces, a size never split from its unit."""
    kept = re.sub(r"(\d) (B|KiB|MiB|GiB)\b", "\\1\u00a0\\2", text)  # textwrap breaks only at ASCII spaces
    lines = textwrap.wrap(kept, _PROSE_WIDTH, initial_indent="  ", subsequent_indent="  ")
    return [line.replace("\u00a0", " ") for line in lines]


def offload_summary(manager: Any, recorder: UseRecorder, budget: int, margin: int) -> list[str]:
    """The run's bytes each way, models that left the device (whole or down to a prefix) and peak, beside
    the peer's rule replayed on the same uses."""
    engine = manager.offload_engine
    log = engine.log
    ours = ReplayResult(
        strategy=strategy_name(engine.strategy),
        bytes_to_device=log.total_bytes_to_device,
        bytes_to_host=log.total_bytes_to_host,
        evictions=log.total_evictions,
        peak_resident_bytes=engine.peak_resident_bytes,
        shrinks=log.total_shrinks,
    )
    unit = unit_for(budget)
    try:
        peer: ReplayResult | None = replay(
            recorder.events, recorder.sizes, budget, margin, SmallestSufficientSet(), copies_back=True
        )
    except ModelTooLargeError:
        peer = None  # the peer's rule moves whole models only; ours streamed one larger than the device
    results = [("ours", ours)] + ([("the peer's rule", peer)] if peer is not None else [])
    rows = [
        ("", "to device", "copied back", "left the device", "peak"),
        *(
            (
                name,
                size_text(r.bytes_to_device, unit),
                size_text(r.bytes_to_host, unit),
                f"{r.left_device} ({r.evictions} whole, {r.shrinks} shrunk)",
                size_text(r.peak_resident_bytes, unit),
            )
            for name, r in results
        ),
    ]
    if peer is None:
        rows.append(("the peer's rule", "cannot run", "-", "-", "-"))
    widths = [max(len(row[k]) for row in rows) for k in range(5)]
    table = [
        "  "
        + "  ".join(
            cell.ljust(w) if k == 0 else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    ]
    uses = sum(1 for kind, _ in recorder.events if kind == "use")
    return [
        f"Offload over the run ({len(log)} decisions, {uses} model uses):",
        *table,
        *_prose(
            f"Ours is {ours.strategy}; the peer's rule is {strategy_name(SmallestSufficientSet())}, replayed on "
            f"the same model uses with the same budget ({size_text(budget, unit)}) and margin "
            f"({size_text(margin, unit)}). Left the device: victims evicted whole, or shrunk to a resident prefix "
            "(only their tail left). "
            + (
                'The peer\'s rule moves each victim back with module.to("cpu"), so every evicted byte is copied '
                "back; ours keeps a host copy instead."
                if peer is not None
                else "The peer's rule cannot run this: it moves whole models, and a model is larger than the "
                "device (ours streamed it)."
            )
        ),
    ]


def _png(array: np.ndarray) -> PIL.Image.Image:
    return PIL.Image.fromarray((np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8))


def save_job(result: JobResult, folder: Path, prefix: str, overwrite: bool = False) -> list[Path]:
    """Save the job's images (``<prefix>-seed<seed>-<n>.png``; a video as ``<prefix>-seed<seed>-<n>.mp4``) and the
    images it derived (``<job>-<input>.png``, ``control_image`` as ``control``); returns the paths.

    A file of that name is kept unless ``overwrite``: the new one is numbered (``...-run2.png``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    seed = result.job.seed
    paths = []
    for number, array in enumerate(result.images):
        if array.ndim == 4:  # frames [F, H, W, 3]
            path = _free(folder / f"{prefix}-seed{seed}-{number}{VIDEO_SUFFIX}", overwrite)
            export_video(np.clip(array, 0.0, 1.0), path)
        else:
            path = _free(folder / f"{prefix}-seed{seed}-{number}.png", overwrite)
            _png(array).save(path)
        paths.append(path)
    for name, value in result.derived.items():
        if isinstance(value, PIL.Image.Image):
            path = _free(folder / f"{result.job.name}-{name.removesuffix('_image')}.png", overwrite)
            value.save(path)
            paths.append(path)
    return paths


def numbered(path: Path) -> bool:
    """Whether ``save_job`` numbered ``path`` because a file of its name was there."""
    return re.search(r"-run\d+$", path.stem) is not None


def _free(path: Path, overwrite: bool) -> Path:
    """``path``, or when it exists (and may not be replaced) the first free ``<stem>-run<n><suffix>``."""
    if overwrite or not path.exists():
        return path
    for run in itertools.count(2):
        numbered = path.with_name(f"{path.stem}-run{run}{path.suffix}")
        if not numbered.exists():
            return numbered
    raise AssertionError("unreachable")


def save_plot(
    manager: Any,
    recorder: UseRecorder,
    results: Sequence[JobResult],
    folder: Path,
    budget: int,
    margin: int,
    device: str,
) -> Path | None:
    """``memory.png`` in ``folder``, or ``None`` when matplotlib is missing."""
    if not matplotlib_available():
        return None
    bands = [Band(result.job.name, result.started, result.finished) for result in results]
    labels = model_labels(manager, recorder.uses)
    folder.mkdir(parents=True, exist_ok=True)
    return plot_memory(folder / "memory.png", recorder.uses, labels, bands, budget, margin, device)
