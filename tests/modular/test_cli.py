"""The command line: `modular run` (the main job) and `modular inspect`."""

import subprocess
import sys

import PIL.Image
import pytest

from modular.cli import main


def test_run_saves_an_image_from_a_tiny_repo(tmp_path, capsys):
    """`modular run` builds the default tiny repo, generates, saves a PNG and prints the manager."""
    assert main(["run", "--out", str(tmp_path / "out"), "--quiet", "--steps", "1"]) == 0
    images = list((tmp_path / "out").glob("*.png"))
    assert len(images) == 1
    assert PIL.Image.open(images[0]).size == (64, 64)
    printed = capsys.readouterr().out
    assert "UNet2DConditionModel" in printed and f"saved {images[0]}" in printed


def test_inspect_shows_blocks_and_components_without_loading(capsys):
    """`modular inspect` prints the block tree, the doc and each component's load ID."""
    assert main(["inspect", "--workflow", "text2image"]) == 0
    printed = capsys.readouterr().out
    assert "Inputs:" in printed and "prompt" in printed
    assert "unet: UNet2DConditionModel  load_id=" in printed


def test_run_works_for_every_installed_family(tmp_path):
    """`modular run --family X` generates an image for each family registered by entry point."""
    from modular import available_families

    for name, family in available_families().items():
        if family.make_tiny_repo is None:
            continue
        out = tmp_path / name
        assert main(["run", "--family", name, "--out", str(out), "--quiet", "--steps", "1"]) == 0
        assert len(list(out.glob("*.png"))) == 1, name


def test_missing_repo_is_one_line_on_stderr_and_status_2(tmp_path, capsys):
    """A repo folder that does not exist is one `modular: error:` line on stderr and exit status 2."""
    missing = tmp_path / "missing"
    assert main(["run", "--repo", str(missing), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"modular: error: FileNotFoundError: '{missing}' is not a folder on disk")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_missing_repo_from_the_shell_prints_no_traceback(tmp_path):
    """`python -m modular inspect --repo <missing>` exits 2 with one stderr line and no traceback."""
    missing = tmp_path / "missing"
    done = subprocess.run(
        [sys.executable, "-m", "modular", "inspect", "--repo", str(missing)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("modular: error: FileNotFoundError: ")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_unknown_family_is_one_line(capsys):
    """An unknown --family is one error line naming the installed families, exit status 2."""
    assert main(["inspect", "--family", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modular: error: ValueError: unknown family 'nope'; installed families: [")
    assert err.count("\n") == 1


def test_error_line_keeps_the_first_line_of_the_message(monkeypatch, capsys):
    """Only a message's first line is printed, and a KeyError's message without the quotes str() adds."""
    import modular.cli as cli

    def fail(args):
        raise KeyError("no component named 'unte'\nsecond line")

    monkeypatch.setattr(cli, "inspect", fail)
    assert main(["inspect"]) == 2
    assert capsys.readouterr().err == "modular: error: KeyError: no component named 'unte'\n"


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    """With --debug, or MODULAR_DEBUG=1, the error propagates (so Python prints the traceback)."""
    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        main(["inspect", "--repo", missing, "--debug"])
    monkeypatch.setenv("MODULAR_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["inspect", "--repo", missing])


def test_interrupt_exits_130(monkeypatch, capsys):
    """Ctrl-C during a command is exit status 130 and one line, no traceback."""
    import modular.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "inspect", interrupted)
    assert main(["inspect"]) == 130
    assert capsys.readouterr().err == "modular: interrupted\n"


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ("-1", "must be at least 1 (got -1)"),
        ("0", "must be at least 1 (got 0)"),
        ("two", "must be a positive whole number (got 'two')"),
    ],
)
def test_steps_must_be_a_positive_whole_number(steps, reason, tmp_path, capsys):
    """--steps below 1 is refused when the arguments are parsed: exit status 2, nothing generated."""
    with pytest.raises(SystemExit) as info:
        main(["run", "--steps", steps, "--out", str(tmp_path / "out"), "--quiet"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"modular run: error: argument --steps: {reason}"
    assert not (tmp_path / "out").exists()


def test_output_is_named_after_the_family_that_ran(tmp_path, capsys):
    """A Flux repo given with --repo (and the default --family) saves flux-seed0-0.png."""
    from blocks.flux import make_tiny_repo

    repo = make_tiny_repo(tmp_path / "tiny-flux")
    out = tmp_path / "out"
    assert main(["run", "--repo", str(repo), "--out", str(out), "--quiet", "--steps", "1"]) == 0
    assert sorted(path.name for path in out.glob("*.png")) == ["flux-seed0-0.png"]
