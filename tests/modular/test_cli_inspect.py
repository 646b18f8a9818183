"""`modular inspect`: its lines fit the terminal's width and its load IDs name the repo as the user gave it."""

from modular.cli.inspect_command import fit_lines, shown_load_id
from modular.cli.main import main


def _load_ids(printed):
    return {
        line.split(":")[0].strip(): line.split("load_id=")[1]
        for line in printed.split("Components (not loaded):")[1].splitlines()
        if "load_id=" in line
    }


def test_inspect_fits_80_columns_and_names_the_tiny_repo_not_a_deleted_temp_folder(capsys):
    """Without a REPO every line fits $COLUMNS (80 in tests) and the load IDs name the family's tiny repo,
    whose temporary folder is gone once the command ends."""
    assert main(["inspect", "--workflow", "text2image"]) == 0
    printed = capsys.readouterr().out
    assert max(len(line) for line in printed.splitlines()) <= 80
    assert "/tmp" not in printed
    ids = _load_ids(printed)
    assert ids["unet"] == "tiny-stable-diffusion|unet|null|null"
    assert ids["guider"] == "null"


def test_inspect_names_a_relative_folder_as_given(tmp_path, monkeypatch, capsys):
    """`modular inspect my-sd` shows `my-sd|unet|null|null`, not the resolved absolute path; at 200 columns
    the long lines of the block tree stay whole."""
    from blocks.stable_diffusion import make_tiny_repo

    make_tiny_repo(tmp_path / "my-sd")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["inspect", "my-sd", "--workflow", "text2image"]) == 0
    printed = capsys.readouterr().out
    assert _load_ids(printed)["unet"] == "my-sd|unet|null|null"
    assert str(tmp_path) not in printed
    assert 80 < max(len(line) for line in printed.splitlines()) <= 200


def test_fit_lines_wraps_long_lines_under_their_indent():
    """A line over the width wraps at spaces, its continuation indented four past its own indent."""
    lines = ["short", "  name: Step  # one two three four five six seven"]
    assert fit_lines(lines, 24) == [
        "short",
        "  name: Step  # one two",
        "      three four five",
        "      six seven",
    ]


def test_shown_load_id_renames_only_the_given_repo():
    """The repo part is replaced when it is the repo given (or its resolved path); other repos stay."""
    assert shown_load_id("/abs/my-sd|unet|null|null", "/abs/my-sd", "my-sd") == "my-sd|unet|null|null"
    assert shown_load_id("org/other|vae|fp16|main", "/abs/my-sd", "my-sd") == "org/other|vae|fp16|main"
    assert shown_load_id(None, "/abs/my-sd", "my-sd") == "null"
