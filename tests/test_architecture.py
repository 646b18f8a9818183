"""docs/architecture.md names only paths that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `offload/engine/engine.py`, `blocks/common`, `pyproject.toml`: backticked words with a slash or a file suffix.
_PATH = re.compile(r"`([\w./-]+(?:/[\w./-]*|\.(?:py|toml|md)))`")


def named_paths() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return sorted({match.rstrip("/") for match in _PATH.findall(text)})


def test_the_architecture_page_names_paths():
    """The page names the modules it describes (so the check below checks something)."""
    assert len(named_paths()) >= 25


def test_every_path_the_architecture_page_names_exists():
    """Each backticked path in docs/architecture.md is a file or folder of the repo."""
    missing = [path for path in named_paths() if not (ROOT / path).exists()]
    assert missing == []
