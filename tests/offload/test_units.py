"""Byte-size parsing and formatting."""

import pytest

from offload import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (123, 123), ("8GB", 8 * 10**9), ("1.5GiB", 3 * 2**29), ("512 MB", 512 * 10**6), ("7", 7)],
)
def test_parse_bytes_accepts_ints_and_unit_strings(value, expected):
    """Ints pass through; strings with decimal or binary units become bytes."""
    assert parse_bytes(value) == expected


def test_parse_bytes_rejects_unknown_unit():
    """An unknown unit names the value, the accepted units and an example."""
    with pytest.raises(ValueError, match=r"margin must be a number followed by a unit.*\(got '3 parsecs'\)"):
        parse_bytes("3 parsecs", name="margin")


def test_parse_bytes_rejects_negative_and_wrong_types():
    """Negative ints are ValueError; floats and bools are TypeError."""
    with pytest.raises(ValueError, match=r"size must be >= 0 bytes \(got -1\)"):
        parse_bytes(-1)
    with pytest.raises(TypeError, match="size must be an int"):
        parse_bytes(1.5)
    with pytest.raises(TypeError, match="size must be an int"):
        parse_bytes(True)


def test_format_bytes_picks_a_readable_unit():
    """Gigabytes from 0.01 GB, megabytes from 1 MB, bytes below."""
    assert format_bytes(22_170_000_000) == "22.17 GB"
    assert format_bytes(1_500_000) == "1.50 MB"
    assert format_bytes(12_000) == "12000 B"
