"""The offload log's table prints each size column in one unit, chosen from its largest value."""

from offload.records.log import OffloadDecision, OffloadLog


def test_each_size_column_of_the_log_has_one_unit():
    """A 22 MiB move puts the whole "to device" column in MiB (the 240 KiB move reads 0.23 MiB, not
    "245760 B"); a column of small values stays in bytes."""
    log = OffloadLog(device="sim")
    log.append(OffloadDecision(0.0, "transformer", (), 22 * 2**20, 0, 32 * 2**20, 10 * 2**20, "fits"))
    log.append(OffloadDecision(0.0, "clip", ("t5",), 240 * 2**10, 0, 900, 500, "evict: NextUseStrategy"))
    rows = [[cell.strip() for cell in line.split(" | ")] for line in str(log).splitlines()[2:4]]
    assert [row[3:7] for row in rows] == [
        ["22.00 MiB", "0 B", "32.00 MiB", "10.00 MiB"],
        ["0.23 MiB", "0 B", "<0.01 MiB", "<0.01 MiB"],
    ]
