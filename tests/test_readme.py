"""README's promises point at tests that exist, and the output it shows is what the code prints."""

import ast
import re
from pathlib import Path

from modular.cli.main import main
from tests.doc_outputs import fences, matches

ROOT = Path(__file__).resolve().parent.parent
_NAMED_TEST = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _guarantees() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Guarantees")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_the_guarantees_name_exists():
    """Each `tests/...py::test_name` in README's Guarantees is a test function in that file."""
    named = _NAMED_TEST.findall(_guarantees())
    assert len(named) >= 20
    missing = [f"{path}::{name}" for path, name in named if name not in _test_names(ROOT / path)]
    assert missing == []


def test_every_guarantee_names_a_test():
    """Each bullet of README's Guarantees names at least one test."""
    bullets = re.split(r"\n- ", _guarantees())[1:]
    assert bullets
    unbacked = [bullet.splitlines()[0] for bullet in bullets if not _NAMED_TEST.search(bullet)]
    assert unbacked == []


def _shown_output(command: str) -> str:
    """The ```text block of README that starts with ``$ command``, without that line."""
    for fence in fences((ROOT / "README.md").read_text()):
        first, _, rest = fence.text.partition("\n")
        if fence.language == "text" and first == f"$ {command}":
            return rest
    msg = f"README.md shows no output of {command!r}"
    raise AssertionError(msg)


def test_every_text_block_of_the_readme_is_a_checked_output_or_marked():
    """README's ```text blocks are the demo's output (checked below) or carry the not-output mark."""
    unchecked = [
        fence.line
        for fence in fences((ROOT / "README.md").read_text())
        if fence.language == "text"
        and not fence.not_output
        and not fence.text.startswith("$ ./scripts/demo.sh\n")
    ]
    assert unchecked == []


def test_the_demo_output_the_readme_shows_is_what_modular_run_prints(tmp_path, monkeypatch, capsys):
    """`./scripts/demo.sh` runs `modular run --output out` from the clone: README shows what it prints
    (`...` for timings, ids, temp paths and the rows left out)."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--output", "out"]) == 0
    printed = capsys.readouterr().out
    shown = _shown_output("./scripts/demo.sh")
    assert matches(shown, printed), f"README shows:\n{shown}\nmodular run printed:\n{printed}"
