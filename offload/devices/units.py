"""Byte sizes: parse "3GB"-style strings as the peer does, and print them with labels that mean what they say.

One convention, for parsing and printing alike: decimal labels (kB, MB, GB, TB) are powers of ten and IEC
labels (KiB, MiB, GiB, TiB) powers of two.

- Parsing follows accelerate's ``convert_file_size_to_int``, which the peer uses for its
  ``memory_reserve_margin``: ``"3GB"`` is 3 * 10**9 bytes and ``"3GiB"`` 3 * 2**30. So the same margin
  string reserves the same bytes here and in the peer.
- Printing divides by powers of two and says so: ``"22.17 GiB"`` (a Flux transformer: the number the
  peer's table prints, under the label that means it), ``"30.52 MiB"`` for a typed ``"32MB"``, as torch's
  out-of-memory messages do. Write ``"3GiB"`` to get a margin that prints as a round 3.00 GiB.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "GiB",
    "KiB",
    "MiB",
    "column_unit",
    "format_bytes",
    "format_bytes_distinct",
    "format_in",
    "parse_bytes",
]

KiB = 2**10
"""Bytes in one printed "KiB"."""
MiB = 2**20
"""Bytes in one printed "MiB"."""
GiB = 2**30
"""Bytes in one printed "GiB" (the peer's table prints the same number, labelled GB)."""
_LABELS = {GiB: "GiB", MiB: "MiB", KiB: "KiB", 1: "B"}

# What accelerate's convert_file_size_to_int accepts, plus B, TB and TiB.
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: int | str, *, name: str = "size") -> int:
    """Return a byte count from an int or a string such as ``"3GB"``, ``"1.5GiB"`` or ``"512MB"``.

    Units read as accelerate (and so the peer's ``memory_reserve_margin``) reads them: KB, MB, GB,
    TB are powers of 1000 (``"3GB"`` is 3 * 10**9 bytes); KiB, MiB, GiB, TiB powers of 1024.

    Args:
        value: A non-negative int, or a number followed by a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB).
        name: What the value is, for the error message.

    Raises:
        TypeError: ``value`` is neither an int nor a string.
        ValueError: ``value`` is negative or not a recognised size.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        msg = f"{name} must be an int (bytes) or a string such as '8GB' (got {value!r} that is a {type(value)})."
        raise TypeError(msg)
    if isinstance(value, int):
        if value < 0:
            msg = f"{name} must be >= 0 bytes (got {value})."
            raise ValueError(msg)
        return value
    match = _PATTERN.match(value)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        msg = (
            f"{name} must be a number followed by a unit, one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB "
            f"(got {value!r}). Example: '8GB'."
        )
        raise ValueError(msg)
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(nbytes: float, digits: int = 2) -> str:
    """Return ``nbytes`` for people, with IEC labels (``GiB`` = 2**30 bytes, ``MiB`` = 2**20).

    ``"22.17 GiB"`` from 1 GiB, ``"1.50 MiB"`` from 1 MiB, ``"400 B"`` below (exact bytes, as the small
    budgets of simulated devices are given); ``digits`` decimals for GiB and MiB.
    """
    if abs(nbytes) >= GiB:
        return f"{nbytes / GiB:.{digits}f} GiB"
    if abs(nbytes) >= MiB:
        return f"{nbytes / MiB:.{digits}f} MiB"
    return f"{int(nbytes)} B"


def column_unit(values: Sequence[float]) -> int:
    """The one unit for a column of sizes, chosen from its largest value: GiB, MiB, KiB or B (as bytes).

    ``column_unit([2 * 2**30, 300])`` is ``GiB``: every size of that column prints in GiB (``format_in``).
    """
    largest = max((abs(value) for value in values), default=0)
    return next(unit for unit in _LABELS if largest >= unit or unit == 1)


def format_in(nbytes: float, unit: int, digits: int = 2) -> str:
    """Return ``nbytes`` in ``unit`` (``GiB``, ``MiB``, ``KiB`` or 1 for bytes), labelled.

    ``format_in(3 * 2**29, GiB) == "1.50 GiB"``; a size that is not zero but rounds to zero prints as
    ``"<0.01 GiB"``, so a small model never reads as empty; bytes print whole (``"300 B"``).
    """
    if unit not in _LABELS:
        msg = f"unit must be one of GiB, MiB, KiB or 1 (bytes) (got {unit!r})."
        raise ValueError(msg)
    label = _LABELS[unit]
    if unit == 1:
        return f"{int(nbytes)} B"
    text = f"{nbytes / unit:.{digits}f}"
    if nbytes and float(text) == 0:
        return f"<{10**-digits:.{digits}f} {label}"
    return f"{text} {label}"


def format_bytes_distinct(*values: int) -> list[str]:
    """Format ``values`` for one message so that different sizes never print alike.

    Decimals grow from 2 to 6 until every two different values print differently; if some still do not,
    each value gets its exact bytes in parentheses.

    Example:
        >>> format_bytes_distinct(2632704, 2631000)
        ['2.511 MiB', '2.509 MiB']
    """
    distinct = len(set(values))
    for digits in range(2, 7):
        texts = [format_bytes(value, digits) for value in values]
        if len(set(texts)) == distinct:
            return texts
    return [f"{format_bytes(value)} ({value} B)" if value >= MiB else format_bytes(value) for value in values]
