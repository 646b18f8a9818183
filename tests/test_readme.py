"""README's promises point at tests that exist."""

import ast
import re
from pathlib import Path

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
