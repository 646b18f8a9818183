"""Every guide in docs/ runs: its ```python blocks execute in order, in one namespace per guide."""

import re
from pathlib import Path

import pytest

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
def test_guide_examples_run(guide, tmp_path, monkeypatch):
    """The guide's python blocks run without error, in a scratch folder."""
    monkeypatch.chdir(tmp_path)
    run_guide(guide)


def run_guide(guide: Path) -> None:
    """Run the guide's python blocks in order, in one namespace, in the current folder."""
    namespace = {"__name__": f"docs_{guide.stem}"}
    for number, code in enumerate(python_blocks(guide), start=1):
        compiled = compile(code, f"{guide.name}[block {number}]", "exec")
        exec(compiled, namespace)


def test_a_guide_that_writes_folders_runs_again_in_the_same_folder(tmp_path, monkeypatch):
    """A reader who runs custom_blocks.md twice in one folder is not stopped by the folders the first run made."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        run_guide(DOCS / "custom_blocks.md")
