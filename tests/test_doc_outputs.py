"""The check of shown outputs (tests/doc_outputs.py) catches a guide that shows what its code does not print."""

import shutil
from pathlib import Path

import pytest

from tests.doc_outputs import NOT_OUTPUT, ShownOutputError, fences, matches, run_guide_text

DOCS = Path(__file__).resolve().parent.parent / "docs"

FENCE = "```"


def guide(*parts: str) -> str:
    """A guide made of prose and fenced blocks, each part a line or a block."""
    return "\n".join(parts) + "\n"


def block(language: str, text: str) -> str:
    return f"{FENCE}{language}\n{text}\n{FENCE}"


def test_a_guide_whose_shown_outputs_are_printed_passes():
    """Trailing comments of prints, and a text block after the python block, that say what is printed pass."""
    text = guide(
        "# A guide",
        block("python", 'names = ["unet", "vae"]\nprint(len(names))  # 2\nprint(names)'),
        "It prints:",
        block("text", "2\n['unet', ...]"),
    )
    assert run_guide_text(text, "fake.md")["names"] == ["unet", "vae"]


def test_a_wrong_print_comment_fails_naming_the_line_and_both_texts():
    """A print whose trailing comment is not what it prints fails at the guide's own line."""
    text = guide("# A guide", block("python", "x = 3\nprint(x + 1)  # 5"))
    with pytest.raises(ShownOutputError, match=r"fake.md:4: the print shows '5' but printed '4'"):
        run_guide_text(text, "fake.md")


def test_a_wrong_text_block_fails():
    """A text block after a python block that is not what the block printed fails."""
    text = guide(block("python", "print('sim(sim)')"), block("text", "cpu(sim)"))
    with pytest.raises(ShownOutputError, match=r"fake.md:4: the ```text block is not what"):
        run_guide_text(text, "fake.md")


def test_every_mismatch_of_a_guide_is_reported_at_once():
    """Two wrong outputs in one guide are both named."""
    text = guide(block("python", "print(1)  # 2"), block("text", "3"))
    with pytest.raises(ShownOutputError) as caught:
        run_guide_text(text, "fake.md")
    assert "fake.md:2:" in str(caught.value) and "fake.md:4:" in str(caught.value)


def test_comments_on_other_statements_are_prose():
    """A trailing comment on a statement that is not a print is not compared."""
    text = guide(block("python", "x = 1  # one model\nprint(x)  # 1"))
    run_guide_text(text, "fake.md")


def test_a_nested_prints_comment_is_the_output_of_its_top_level_statement():
    """A print in an ``except`` shows the error; a print in a loop must show every pass's output."""
    text = guide(
        block(
            "python",
            "try:\n    int('x')\nexcept ValueError as error:\n    print(error)  # invalid literal ...",
        )
    )
    run_guide_text(text, "fake.md")
    loop = guide(block("python", "for x in (1, 2):\n    print(x)  # 1"))
    with pytest.raises(ShownOutputError, match=r"fake.md:3: the print shows '1' but printed '1\\n2'"):
        run_guide_text(loop, "fake.md")


def test_a_comment_the_check_cannot_place_is_refused():
    """A commented print inside a def, or one of two prints in a statement, is refused, not skipped."""
    in_def = guide(block("python", "def show():\n    print(1)  # 1"))
    with pytest.raises(ShownOutputError, match=r"fake.md:3: a print in a definition prints when called"):
        run_guide_text(in_def, "fake.md")
    two = guide(block("python", "if True:\n    print(1)  # 1\n    print(2)"))
    with pytest.raises(ShownOutputError, match=r"fake.md:3: a statement with several prints"):
        run_guide_text(two, "fake.md")


def test_an_unmarked_text_block_after_no_python_block_is_refused():
    """A text block that follows a bash block must be marked as no output, so none goes unchecked."""
    text = guide(block("bash", "modular run"), block("text", "anything"))
    with pytest.raises(ShownOutputError, match=r"follows no ```python block"):
        run_guide_text(text, "fake.md")
    marked = guide(block("bash", "modular run"), NOT_OUTPUT, block("text", "anything"))
    run_guide_text(marked, "fake.md")


def test_a_text_block_marked_not_output_is_not_compared():
    """A sketch in a text block after a python block, marked, is left alone."""
    text = guide(block("python", "print('a')"), NOT_OUTPUT, block("text", "import torch  # needs a GPU"))
    run_guide_text(text, "fake.md")


def test_an_ellipsis_stands_for_paths_and_ids_and_whitespace_runs_compare_equal():
    """`...` matches any text across lines; aligned columns match whatever their width."""
    printed = "unet_140711161094800    | UNet2DConditionModel | /tmp/tmpab12/tiny-sd|unet|null|null\nmore\n"
    assert matches("unet_... | UNet2DConditionModel | .../tiny-sd|unet|null|null\n...", printed)
    assert not matches("unet_... | UNet2DConditionModel | .../tiny-sd|vae|null|null\n...", printed)


def test_the_dry_run_batch_md_shows_is_what_modular_batch_prints(tmp_path, monkeypatch, capsys):
    """batch.md's dry-run output (marked as no output of a python block) is what `modular batch job.json
    --dry-run --ranks 2` prints for the guide's job before any of its entries is done."""
    from modular.cli.main import main

    monkeypatch.chdir(tmp_path)
    guide_fences = fences((DOCS / "batch.md").read_text())
    first = next(fence for fence in guide_fences if fence.language == "python")
    exec(compile(first.text, "batch.md", "exec"), {"__name__": "docs_batch"})  # writes tiny-sd and job.json
    shutil.rmtree("out")  # the job as it was before its run: nothing done yet
    capsys.readouterr()
    assert main(["batch", "job.json", "--dry-run", "--ranks", "2"]) == 0
    printed = capsys.readouterr().out
    shown = next(f.text for f in guide_fences if f.language == "text" and f.text.startswith("job.json: "))
    assert matches(shown, printed), f"batch.md shows:\n{shown}\nmodular batch printed:\n{printed}"
