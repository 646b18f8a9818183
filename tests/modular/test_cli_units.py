"""The command line echoes a typed size as the same bytes, under a label that means them."""

from modular.cli.main import main


def test_budget_and_margin_are_echoed_as_the_bytes_typed(tmp_path, capsys):
    """`--budget 32MB --margin 3MB` (decimal: 32 * 10**6 and 3 * 10**6 bytes) echo as 30.52 MiB and 2.86 MiB,
    the same bytes under IEC labels, never as "30.52 MB"; the run report uses the same unit."""
    argv = ["run", "--family", "stable-diffusion", "--steps", "1", "--offload", "sim", "--budget", "32MB"]
    argv += ["--margin", "3MB", "--quiet", "--no-table", "--output", str(tmp_path / "out")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Auto offload on a simulated device, budget 30.52 MiB, margin 2.86 MiB;\nstrategy" in printed
    # the offload summary's prose
    assert "with the same budget (30.52 MiB) and margin (2.86 MiB)" in " ".join(printed.split())
    assert " MB" not in printed and " GB" not in printed
