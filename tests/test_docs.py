"""Every guide in docs/ runs and shows what it prints: its ```python blocks execute in order, in one
namespace per guide, and each output it shows is compared with the printed one (the rules, and the
``<!-- not output -->`` mark for a ```text block that is no output, are in tests/doc_outputs.py)."""

import re
from pathlib import Path

import pytest

from tests.doc_outputs import run_guide

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDES = sorted(DOCS.glob("*.md"))
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    return _BLOCK.findall(path.read_text())


def test_every_guide_has_runnable_examples():
    """Each guide carries at least one python example (so the runner below checks something)."""
    assert GUIDES, "docs/ has no guides"
    empty = [g.name for g in GUIDES if not python_blocks(g)]
    assert empty == []


@pytest.mark.parametrize("guide", GUIDES, ids=[g.name for g in GUIDES])
def test_guide_examples_run_and_print_what_they_show(guide, tmp_path, monkeypatch):
    """The guide's python blocks run without error, in a scratch folder, and print what the guide shows."""
    monkeypatch.chdir(tmp_path)
    run_guide(guide)


def test_a_guide_that_writes_folders_runs_again_in_the_same_folder(tmp_path, monkeypatch):
    """A reader who runs custom_blocks.md twice in one folder is not stopped by the folders the first run made."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        run_guide(DOCS / "custom_blocks.md")
