"""Byte-size parsing (as the peer's margin reads it) and formatting (as the components table prints)."""

import pytest
from accelerate.utils.modeling import convert_file_size_to_int

from offload import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (123, 123), ("8GB", 8 * 10**9), ("1.5GiB", 3 * 2**29), ("512 MB", 512 * 10**6), ("7", 7)],
)
def test_parse_bytes_accepts_ints_and_unit_strings(value, expected):
    """Ints pass through; strings with decimal or binary units become bytes."""
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", ["3GB", "1.5GB", "512MB", "10KB", "2GiB", "1.5GiB", "64MiB", "4KiB"])
def test_parse_bytes_reads_units_as_the_peers_margin_does(value):
    """A size string means the same bytes as in accelerate's parser, which the peer uses for its margin."""
    assert parse_bytes(value) == convert_file_size_to_int(value)


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


def test_format_bytes_prints_gb_of_1024_cubed_like_the_components_table():
    """A printed GB is 1024**3 bytes, as in the components table: the seed's Flux transformer is 22.17 GB."""
    assert format_bytes(int(22.17 * 1024**3)) == "22.17 GB"
    assert format_bytes(3 * 2**30) == "3.00 GB"
    assert format_bytes(10**9) == "0.93 GB"


def test_format_bytes_picks_a_readable_unit():
    """Gigabytes from 0.01 GB, megabytes (1024**2 bytes) from 1 MB, bytes below."""
    assert format_bytes(2**30 // 100 + 1) == "0.01 GB"
    assert format_bytes(2**30 // 100 - 1) == "10.24 MB"
    assert format_bytes(3 * 2**19) == "1.50 MB"
    assert format_bytes(2**20 - 1) == "1048575 B"
    assert format_bytes(12_000) == "12000 B"


def test_sizes_in_one_message_get_decimals_until_they_differ():
    """Two different sizes never print alike: decimals grow, then exact bytes are added."""
    from offload import format_bytes_distinct

    assert format_bytes_distinct(2632704, 2631000) == ["2.511 MB", "2.509 MB"]
    assert format_bytes_distinct(3 * 2**30, 2**30, 3 * 2**30) == ["3.00 GB", "1.00 GB", "3.00 GB"]
    assert format_bytes_distinct(2**30 + 1, 2**30) == ["1.00 GB (1073741825 B)", "1.00 GB (1073741824 B)"]
    assert format_bytes_distinct(900, 800) == ["900 B", "800 B"]
