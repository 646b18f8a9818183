"""Laying out the manager's table as text: column widths, fitting a width, one size unit per column, the summary.

``components.table`` gathers the rows from a manager; this module only arranges them. Given a width, the table
shrinks in steps until it fits (``fit_table``): first the Dtype column drops the ``torch.`` prefix, then load
IDs are shortened in the middle (``shorten_load_id``), then collection names wrap. The summary
(``render_summary``) is one line per component, for a terminal too narrow for any form of the table.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import attrs

from offload.devices.units import column_unit, format_in

__all__ = [
    "ELLIPSIS",
    "EMPTY_TABLE",
    "MODEL_HEADER",
    "MODIFIED_MARK",
    "OTHER_HEADER",
    "ModelRow",
    "OtherRow",
    "fit_table",
    "render_summary",
    "render_table",
    "shorten_load_id",
]

MODEL_HEADER = ("Name_ID", "Class", "Device: act(exec)", "Dtype", "Size", "Load ID", "Collection")
OTHER_HEADER = ("ID", "Class", "Collection")
EMPTY_TABLE = "Components: none registered."
#: Follows the load ID of a model whose weights differ from it (the "Modified" line says how).
MODIFIED_MARK = " (modified)"
#: Marks where a shortened load ID left characters out (ASCII, so every terminal and log prints it).
ELLIPSIS = "..."
_GAP = " | "
_HEAD_MIN = 4  # the fewest leading characters of a repo a shortened load ID keeps, else none
_COLLECTION_MIN = len("Collection")  # collection names wrap no narrower than the header


@attrs.frozen
class ModelRow:
    """One model of the table: its cells before layout (``size`` in bytes, ``load_id`` without the mark)."""

    component_id: str
    class_name: str
    device: str
    dtype: str
    size: float
    load_id: str
    collections: tuple[str, ...] = ()
    modified: bool = False


@attrs.frozen
class OtherRow:
    """One component that is not a model (a tokenizer, a scheduler)."""

    component_id: str
    class_name: str
    collections: tuple[str, ...] = ()


def shorten_load_id(load_id: str, width: int) -> str:
    """``load_id`` in at most ``width`` characters, shortened in the middle: the start of the repo, ``...``, then
    the repo's last folder name and ``|subfolder|variant|revision``, which are never cut.

    ``shorten_load_id("/tmp/pytest-7/test_a0/tiny-sd|unet|null|null", 34) == "/tmp/pyt.../tiny-sd|unet|null|null"``;
    below the shortest form (``".../tiny-sd|unet|null|null"``) it returns that form, longer than ``width``.
    A load ID that fits, or whose repo has no folder to leave out (``"tiny-sd|unet|null|null"``), is unchanged.
    """
    if len(load_id) <= width:
        return load_id
    repo, bar, rest = load_id.partition("|")
    cut = max(repo.rstrip("/\\").rfind("/"), repo.rstrip("/\\").rfind("\\"))
    if cut <= 0:
        return load_id
    kept = ELLIPSIS + repo[cut:] + bar + rest
    head = width - len(kept)
    # A head of a character or two ("/...") says nothing: then the shortest form.
    return repo[: head if head >= _HEAD_MIN else 0] + kept


def _dtype_text(dtype: str, short: bool) -> str:
    return dtype.removeprefix("torch.") if short else dtype


def _wrap_name(name: str, width: int | None) -> list[str]:
    """A collection name in lines of at most ``width``, broken after hyphens where it can be."""
    if width is None or len(name) <= width:
        return [name]
    return textwrap.wrap(name, width, break_on_hyphens=True) or [name]


@attrs.frozen
class _Layout:
    """The choices that shrink the table: short dtypes, the Load ID column's width, the Collection column's."""

    short_dtype: bool = False
    load_id_width: int | None = None
    collection_width: int | None = None


def _model_lines(models: Sequence[ModelRow], layout: _Layout) -> list[list[str]]:
    unit = column_unit([row.size for row in models])
    lines = []
    for row in models:
        mark = MODIFIED_MARK if row.modified else ""
        load_id = row.load_id
        if layout.load_id_width is not None:
            load_id = shorten_load_id(load_id, layout.load_id_width - len(mark))
        cells = [
            row.component_id,
            row.class_name,
            row.device,
            _dtype_text(row.dtype, layout.short_dtype),
            format_in(row.size, unit),
            load_id + mark,
        ]
        lines += _with_collections(cells, row.collections, layout.collection_width)
    return lines


def _other_lines(others: Sequence[OtherRow], layout: _Layout) -> list[list[str]]:
    lines = []
    for row in others:
        lines += _with_collections(
            [row.component_id, row.class_name], row.collections, layout.collection_width
        )
    return lines


def _with_collections(cells: list[str], collections: Sequence[str], width: int | None) -> list[list[str]]:
    """One line per collection (each wrapped to ``width``): the first beside the cells, the rest under them."""
    names = [piece for name in (collections or ["N/A"]) for piece in _wrap_name(name, width)]
    blank = [""] * len(cells)
    return [[*cells, names[0]], *([*blank, extra] for extra in names[1:])]


def _widths(header: Sequence[str], lines: list[list[str]]) -> list[int]:
    return [max(len(cell) for cell in column) for column in zip(header, *lines)]


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return _GAP.join(f"{cell:<{width}}" for cell, width in zip(cells, widths)).rstrip()


def _span(widths: Sequence[int]) -> int:
    return sum(widths) + len(_GAP) * (len(widths) - 1)


def _render(
    models: Sequence[ModelRow],
    others: Sequence[OtherRow],
    extras: Sequence[tuple[str, dict[str, Any]]],
    layout: _Layout,
    width: int | None,
) -> tuple[str, int]:
    """The table under ``layout`` and its width (its widest line apart from wrapped info lines)."""
    model_lines, other_lines = _model_lines(models, layout), _other_lines(others, layout)
    model_widths, other_widths = _widths(MODEL_HEADER, model_lines), _widths(OTHER_HEADER, other_lines)
    # The id column lines up across both tables, as in the seed.
    id_width = max(model_widths[0] if models else 0, other_widths[0] if others else 0)
    model_widths[0] = other_widths[0] = id_width
    total = max(_span(model_widths) if models else 0, _span(other_widths) if others else 0)
    dash, rule = "-" * total, "=" * total
    out = ["Components:", rule]
    if models:
        out += ["Models:", dash, _line(MODEL_HEADER, model_widths), dash]
        out += [_line(line, model_widths) for line in model_lines]
        out.append(dash)
    if others:
        if models:
            out.append("")
        out += ["Other Components:", dash, _line(OTHER_HEADER, other_widths), dash]
        out += [_line(line, other_widths) for line in other_lines]
        out.append(dash)
    out += _info_lines(extras, rule, width)
    return "\n".join(out), total


def _info_lines(extras: Sequence[tuple[str, dict[str, Any]]], rule: str, width: int | None) -> list[str]:
    """The "Additional Component Info" section: per component, its non-empty facts, wrapped to ``width``."""
    shown = [(component_id, {k: v for k, v in info.items() if v}) for component_id, info in extras]
    shown = [(component_id, info) for component_id, info in shown if info]
    if not shown:
        return []
    out = ["", "Additional Component Info:", rule]
    for component_id, info in shown:
        out.append(f"{component_id}:")
        for key, value in info.items():
            text = f"  {key}: {value}"
            if width is None or len(text) <= width:
                out.append(text)
            else:
                out += textwrap.wrap(text, width, subsequent_indent="    ", break_on_hyphens=False)
    return out


def render_table(
    models: Sequence[ModelRow],
    others: Sequence[OtherRow],
    extras: Sequence[tuple[str, dict[str, Any]]],
) -> str:
    """The full table, every column as wide as its widest cell, nothing shortened.

    Args:
        models: One row per model, in the order shown.
        others: One row per other component.
        extras: ``(component id, {"Adapters": ..., "LoRA": ..., ...})`` for the components that have any of
            these; empty values are left out.
    """
    if not models and not others:
        return EMPTY_TABLE
    return _render(models, others, extras, _Layout(), None)[0]


def fit_table(
    models: Sequence[ModelRow],
    others: Sequence[OtherRow],
    extras: Sequence[tuple[str, dict[str, Any]]],
    width: int,
) -> tuple[str, bool]:
    """The table in at most ``width`` columns if it can be made to fit, and whether it fits.

    Shrinks in steps, each only if the table is still too wide: Dtype without ``torch.``, load IDs shortened in
    the middle (never past the repo's last folder and ``|subfolder|variant|revision``), collection names
    wrapped (no narrower than the header). When even that is too wide, it returns the narrowest table and
    ``False``: ``print(cm)`` shows the summary instead.
    """
    if not models and not others:
        return EMPTY_TABLE, True
    layout = _Layout()
    text, total = _render(models, others, extras, layout, width)
    if total <= width:
        return text, True
    layout = attrs.evolve(layout, short_dtype=True)
    text, total = _render(models, others, extras, layout, width)
    if models and total > width:
        widest = max(len(row.load_id) + (len(MODIFIED_MARK) if row.modified else 0) for row in models)
        layout = attrs.evolve(layout, load_id_width=max(widest - (total - width), len("Load ID")))
        text, total = _render(models, others, extras, layout, width)
    if total > width:
        names = [name for row in models for name in row.collections]
        names += [name for row in others for name in row.collections]
        widest = max((len(name) for name in names), default=0)
        layout = attrs.evolve(layout, collection_width=max(widest - (total - width), _COLLECTION_MIN))
        text, total = _render(models, others, extras, layout, width)
    return text, total <= width


_CONTINUED = "    "  # the indent of a component's second line in the summary


def _pack(fields: Sequence[str], load_id: str | None, width: int | None) -> list[str]:
    """``fields`` then ``load_id`` two spaces apart, on as few lines of at most ``width`` as they fit; later
    lines indented. The load ID is shortened in the middle to fit the room left (``shorten_load_id``)."""
    lines = [fields[0]]
    for field in fields[1:]:
        if width is not None and len(lines[-1]) + 2 + len(field) > width:
            lines.append(_CONTINUED + field)
        else:
            lines[-1] += "  " + field
    if load_id is None:
        return lines
    if width is None:
        lines[-1] += "  " + load_id
        return lines
    room = width - len(lines[-1]) - 2
    shortened = shorten_load_id(load_id, room)
    if len(shortened) <= room:
        lines[-1] += "  " + shortened
    else:
        lines.append(_CONTINUED + shorten_load_id(load_id, width - len(_CONTINUED)))
    return lines


def render_summary(
    models: Sequence[ModelRow],
    others: Sequence[OtherRow],
    extras: Sequence[tuple[str, dict[str, Any]]],
    width: int | None = None,
) -> str:
    """One line per component: id, class, device, dtype, size (one unit for all), ``(collections)``, load ID.

    With ``width``, a line that would be wider goes on in a second, indented line (the load ID, shortened in
    the middle to fit, as ``shorten_load_id`` does) and info lines wrap; only a single field wider than
    ``width`` is left wider. The facts of "Additional Component Info" follow, as in the table.
    """
    if not models and not others:
        return EMPTY_TABLE
    unit = column_unit([row.size for row in models])
    out = [f"Components: {_count(len(models), 'model')}, {_count(len(others), 'other component')}"]
    if models:
        out.append("Models:")
    for row in models:
        fields = [
            row.component_id,
            row.class_name,
            row.device,
            _dtype_text(row.dtype, True),
            format_in(row.size, unit),
        ]
        fields += _in(row.collections)
        out += _pack(fields, row.load_id + (MODIFIED_MARK if row.modified else ""), width)
    if others:
        out.append("Other Components:")
    for other in others:
        out += _pack([other.component_id, other.class_name, *_in(other.collections)], None, width)
    widest = max(len(line) for line in out)
    out += _info_lines(extras, "=" * (widest if width is None else min(widest, width)), width)
    return "\n".join(out)


def _in(collections: Sequence[str]) -> list[str]:
    return [f"({', '.join(collections)})"] if collections else []


def _count(number: int, what: str) -> str:
    return f"{number} {what}" + ("" if number == 1 else "s")
