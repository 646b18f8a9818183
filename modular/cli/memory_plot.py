"""A picture of device memory over a run: resident weights stacked by model, the budget, one band per job.

Drawn with matplotlib (the optional extra ``plot``) through its object API and the Agg canvas, so no
window, no global figure state and no display are involved.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from offload.devices.units import GiB, KiB, MiB
from offload.engine.replay import Use

__all__ = ["FIGURE_PIXELS", "Band", "matplotlib_available", "plot_memory"]

FIGURE_PIXELS = (1000, 480)
"""Width and height of the PNG, in pixels."""
_DPI = 100


@attrs.frozen
class Band:
    """One job's span on the time axis (``time.perf_counter()`` values)."""

    label: str
    start: float
    end: float


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported (it is the optional extra ``plot``)."""
    return importlib.util.find_spec("matplotlib") is not None


def _unit(budget: int) -> tuple[str, float]:
    """The axis's unit, an IEC label and the bytes it means, as the table and the run report print sizes."""
    if budget >= GiB:
        return "GiB", GiB
    if budget >= MiB:
        return "MiB", MiB
    return "KiB", KiB


@attrs.frozen
class _Step:
    """Consecutive uses of one model (a denoising loop is one step): who ran, how often, what was resident."""

    model_id: str
    repeats: int
    resident: Mapping[str, int]
    time: float


def _steps(uses: Sequence[Use]) -> list[_Step]:
    steps: list[_Step] = []
    for use in uses:
        if steps and steps[-1].model_id == use.model_id:
            steps[-1] = attrs.evolve(steps[-1], repeats=steps[-1].repeats + 1)
        else:
            steps.append(_Step(use.model_id, 1, use.resident, use.time))
    return steps


def _band_spans(steps: Sequence[_Step], bands: Sequence[Band]) -> list[tuple[Band, int, int]]:
    """Each band with the first and one-past-last step that ran inside its time span."""
    spans = []
    for band in bands:
        inside = [k for k, step in enumerate(steps) if band.start <= step.time <= band.end]
        if inside:
            spans.append((band, inside[0], inside[-1] + 1))
    return spans


def plot_memory(
    path: str | Path,
    uses: Sequence[Use],
    labels: Mapping[str, str],
    bands: Sequence[Band],
    budget: int,
    margin: int,
    device: str,
) -> Path:
    """Draw the weights resident at each model use, stacked by model, with the budget and a band per job.

    The x axis is the run's model uses in order, a run of uses of one model (a denoising loop) being
    one step labelled ``name xN``: every placement and eviction gets the same room, however short.

    Args:
        path: The PNG to write (``FIGURE_PIXELS`` in size).
        uses: The run's model uses, each with what was resident after it (``offload.engine.replay.UseRecorder``).
        labels: Legend text per model id, bottom of the stack first; others are left out.
        bands: The jobs, in order, by their time spans.
        budget: The device's bytes (drawn as a line), ``margin`` the bytes kept free (a second line).
        device: The device, for the title.

    Raises:
        ModuleNotFoundError: matplotlib is not installed.
    """
    # The font cache notice on matplotlib's first run is a log record, not something to act on.
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    unit, scale = _unit(budget)
    steps = _steps(uses)
    models = [m for m in labels if any(m in step.resident for step in steps)]
    figure = Figure(figsize=(FIGURE_PIXELS[0] / _DPI, FIGURE_PIXELS[1] / _DPI), dpi=_DPI)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    top = budget / scale * 1.15
    shades = ("#f4f4f4", "#e4e9f2")
    for number, (band, first, last) in enumerate(_band_spans(steps, bands)):
        axes.axvspan(first, last, color=shades[number % 2], zorder=0)
        axes.text(
            (first + last) / 2, top * 0.98, band.label, ha="center", va="top", fontsize=10, weight="bold"
        )
    bottoms = [0.0] * len(steps)
    centers = [k + 0.5 for k in range(len(steps))]
    for number, model in enumerate(models):
        heights = [step.resident.get(model, 0) / scale for step in steps]
        size = max(step.resident.get(model, 0) for step in steps) / scale
        label = f"{labels[model]}: {size:.2f} {unit}"
        color = f"C{number % 10}"
        axes.bar(
            centers,
            heights,
            1.0,
            bottoms,
            color=color,
            edgecolor="white",
            linewidth=0.6,
            label=label,
            zorder=2,
        )
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    budget_line = axes.axhline(budget / scale, color="#c0392b", linestyle="--", linewidth=1.6, zorder=3)
    usable_line = axes.axhline(
        (budget - margin) / scale, color="#c0392b", linestyle=":", linewidth=1.2, zorder=3
    )
    handles, names = axes.get_legend_handles_labels()
    handles, names = handles[::-1], names[::-1]  # top of the stack first, as drawn
    handles += [budget_line, usable_line]
    names += [
        f"budget {budget / scale:.2f} {unit}",
        f"budget - margin {(budget - margin) / scale:.2f} {unit}",
    ]
    axes.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    short = {model: labels[model].split(" (")[0] for model in models}
    if len(steps) <= 40:
        names_at = [
            short.get(s.model_id, s.model_id) + (f" x{s.repeats}" if s.repeats > 1 else "") for s in steps
        ]
        axes.set_xticks(centers, names_at, rotation=40, ha="right", fontsize=8)
    axes.set_xlim(0, max(len(steps), 1))
    axes.set_ylim(0, top)
    axes.set_xlabel("model uses in order (consecutive uses of one model, a denoising loop, are one step)")
    axes.set_ylabel(f"weights on the device ({unit})")
    axes.set_title(f"Weights on the device ({device}) at each model use, by model", fontsize=11, loc="left")
    figure.subplots_adjust(left=0.07, right=0.64, bottom=0.25, top=0.92)
    path = Path(path)
    figure.savefig(path, dpi=_DPI)
    return path
