"""Byte sizes: parse "8GB"-style strings and print sizes for people."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

# Decimal and binary units, as accelerate and the peer accept them ("3GB" is 3 * 10**9 there too).
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
    """Return a byte count from an int or a string such as ``"8GB"``, ``"1.5GiB"`` or ``"512MB"``.

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


def format_bytes(nbytes: float) -> str:
    """Return ``nbytes`` for people: ``"22.17 GB"``, ``"1.50 MB"`` (below 0.01 GB) or ``"400 B"`` (below 1 MB)."""
    if abs(nbytes) >= 10**7:
        return f"{nbytes / 10**9:.2f} GB"
    if abs(nbytes) >= 10**6:
        return f"{nbytes / 10**6:.2f} MB"
    return f"{int(nbytes)} B"
