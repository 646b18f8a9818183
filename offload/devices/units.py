"""Byte sizes: parse "3GB"-style strings as the peer does, and print sizes as the components table does.

Two conventions meet here, both the peer's (diffusers' ComponentsManager):

- Parsing follows accelerate's ``convert_file_size_to_int``, which the peer uses for its
  ``memory_reserve_margin``: "GB", "MB", "KB" are decimal (``"3GB"`` is 3 * 10**9 bytes) and "GiB",
  "MiB", "KiB" binary. So the same margin string reserves the same bytes here and in the peer.
- Printing follows the components table and the peer's log: "GB" is 1024**3 bytes (a Flux
  transformer prints as 22.17 GB in both), "MB" 1024**2. Write ``"3GiB"`` to get a margin that
  prints as a round 3.00 GB.
"""

from __future__ import annotations

import re

__all__ = ["GB", "MB", "format_bytes", "format_bytes_distinct", "parse_bytes"]

GB = 1024**3
"""Bytes in one printed "GB" (the components table's and the peer's convention)."""
MB = 1024**2
"""Bytes in one printed "MB"."""

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
    """Return ``nbytes`` for people, in the components table's units (``GB`` = 1024**3 bytes).

    ``"22.17 GB"`` from 0.01 GB, ``"1.50 MB"`` (``MB`` = 1024**2 bytes) from 1 MB, ``"400 B"`` below;
    ``digits`` decimals for GB and MB.
    """
    if abs(nbytes) >= GB / 100:
        return f"{nbytes / GB:.{digits}f} GB"
    if abs(nbytes) >= MB:
        return f"{nbytes / MB:.{digits}f} MB"
    return f"{int(nbytes)} B"


def format_bytes_distinct(*values: int) -> list[str]:
    """Format ``values`` for one message so that different sizes never print alike.

    Decimals grow from 2 to 6 until every two different values print differently; if some still do not,
    each value gets its exact bytes in parentheses.

    Example:
        >>> format_bytes_distinct(2632704, 2631000)
        ['2.511 MB', '2.509 MB']
    """
    distinct = len(set(values))
    for digits in range(2, 7):
        texts = [format_bytes(value, digits) for value in values]
        if len(set(texts)) == distinct:
            return texts
    return [f"{format_bytes(value)} ({value} B)" if value >= MB else format_bytes(value) for value in values]
