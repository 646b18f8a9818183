"""Byte-size parsing (as the peer's margin reads it) and printing: decimal labels mean powers of ten, IEC
labels powers of two, in what is typed and in what is printed."""

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


def test_format_bytes_labels_powers_of_two_with_iec_units():
    """A printed GiB is 2**30 bytes: the seed's Flux transformer is 22.17 GiB (the number the peer prints)."""
    assert format_bytes(int(22.17 * 2**30)) == "22.17 GiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(10**9) == "953.67 MiB"


def test_format_bytes_picks_a_readable_unit():
    """GiB from 1 GiB, MiB from 1 MiB (so 22 MiB never reads as 0.02 GiB), exact bytes below."""
    assert format_bytes(2**30) == "1.00 GiB"
    assert format_bytes(2**30 - 2**20) == "1023.00 MiB"
    assert format_bytes(22 * 2**20) == "22.00 MiB"
    assert format_bytes(3 * 2**19) == "1.50 MiB"
    assert format_bytes(2**20 - 1) == "1048575 B"
    assert format_bytes(12_000) == "12000 B"


@pytest.mark.parametrize(
    ("typed", "printed"),
    [
        ("32MB", "30.52 MiB"),
        ("3MB", "2.86 MiB"),
        ("32MiB", "32.00 MiB"),
        ("8GB", "7.45 GiB"),
        ("3GiB", "3.00 GiB"),
    ],
)
def test_a_typed_size_prints_as_the_same_bytes_under_a_label_that_means_them(typed, printed):
    """ "32MB" (32 * 10**6 bytes) prints as 30.52 MiB, never as "30.52 MB"; a typed MiB prints as itself."""
    assert format_bytes(parse_bytes(typed)) == printed


def test_no_printer_labels_powers_of_two_as_decimal_units():
    """No library source divides by 1024 powers and labels the result "MB" or "GB" (or "KB"): every printer
    uses format_bytes / format_in, or IEC labels of its own."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    label = re.compile(r"""["'](?:KB|MB|GB)["']|\{[^}]*\}\s?(?:KB|MB|GB)\b""")
    offenders = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for package in ("offload", "components", "modular", "blocks")
        for path in sorted((root / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if label.search(line) and "10**" not in line  # the parser's table: decimal labels, powers of ten
    ]
    assert offenders == []


def test_a_column_of_sizes_prints_in_one_unit_chosen_from_its_largest():
    """column_unit picks GiB, MiB, KiB or bytes from the largest value; format_in prints every value in it,
    a non-zero size that would round to zero as "<0.01"."""
    from offload.devices.units import GiB, KiB, MiB, column_unit, format_in

    assert column_unit([300, 2 * GiB, 5 * MiB]) == GiB
    assert column_unit([300, 5 * MiB]) == MiB
    assert column_unit([300, 2048]) == KiB
    assert column_unit([300]) == 1
    assert column_unit([]) == 1
    assert [format_in(size, GiB) for size in (2 * GiB, 5 * MiB, 300, 0)] == [
        "2.00 GiB",
        "<0.01 GiB",
        "<0.01 GiB",
        "0.00 GiB",
    ]
    assert format_in(300, 1) == "300 B"
    assert format_in(3 * KiB // 2, KiB) == "1.50 KiB"
    with pytest.raises(ValueError, match=r"unit must be one of GiB, MiB, KiB or 1 \(bytes\) \(got 1000\)"):
        format_in(5, 1000)


def test_sizes_in_one_message_get_decimals_until_they_differ():
    """Two different sizes never print alike: decimals grow, then exact bytes are added."""
    from offload import format_bytes_distinct

    assert format_bytes_distinct(2632704, 2631000) == ["2.511 MiB", "2.509 MiB"]
    assert format_bytes_distinct(3 * 2**30, 2**30, 3 * 2**30) == ["3.00 GiB", "1.00 GiB", "3.00 GiB"]
    assert format_bytes_distinct(2**30 + 1, 2**30) == ["1.00 GiB (1073741825 B)", "1.00 GiB (1073741824 B)"]
    assert format_bytes_distinct(900, 800) == ["900 B", "800 B"]
