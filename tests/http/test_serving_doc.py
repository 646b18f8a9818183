"""docs/serving.md's walk-through runs as shown: its Python blocks in order (they start the server, in this
process, on a free port), and between them each ```console block's commands in one shell against that
server, each command's output compared with the lines shown under it (``...`` for any text, as in
tests/doc_outputs.py). tests/test_docs.py checks the Python blocks' own outputs."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

import pytest

from tests.doc_outputs import fences, matches

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
PLACEHOLDER = "http://127.0.0.1:8188"  # where the guide's transcripts say the server listens
MARK = "@@ command {} @@"
pytestmark = pytest.mark.slow


def transcript(text: str) -> list[tuple[str, str]]:
    """(command, the output shown under it) of each ``$ `` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"console block text before its first command: {line!r}")
    return [(command, "\n".join(shown)) for command, shown in steps]


def run_console(steps: list[tuple[str, str]], url: str, folder: Path) -> list[str]:
    """Run the commands in one bash (so a variable set by one is seen by the next) against ``url``; returns
    each command's output."""
    script = "".join(
        f"printf '\\n{MARK.format(number)}\\n'\n{command.replace(PLACEHOLDER, url)}\n"
        for number, (command, _shown) in enumerate(steps)
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=folder, capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert done.stderr == "", done.stderr
    outputs = done.stdout.split("\n")
    found: list[list[str]] = []
    for line in outputs:
        if line == MARK.format(len(found)):
            found.append([])
        elif found:
            found[-1].append(line)
    assert len(found) == len(steps), done.stdout
    return ["\n".join(lines) for lines in found]


def test_the_guide_transcripts_show_what_the_commands_print(tmp_path, monkeypatch):
    """Every ```console command of docs/serving.md runs against the guide's own server and prints what the
    guide shows under it; the walk-through submits, watches events, reads a result and cancels."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_serving"}
    commands: list[str] = []
    problems: list[str] = []
    try:
        for fence in fences(GUIDE.read_text()):
            if fence.language == "python":
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(fence.text, f"{GUIDE.name}:{fence.line}", "exec"), namespace)
            elif fence.language == "console":
                steps = transcript(fence.text)
                outputs = run_console(steps, namespace["server"].url, tmp_path)
                for (command, shown), printed in zip(steps, outputs):
                    commands.append(command)
                    if not matches(shown, printed):
                        problems.append(f"$ {command}\nshown:\n{shown}\nprinted:\n{printed}")
    finally:
        if "server" in namespace:
            namespace["server"].stop()
        if "scheduler" in namespace:
            namespace["scheduler"].close()
    assert problems == []
    walked = " ".join(commands)
    for part in (
        "/v1/jobs -H",
        "/events",
        "/result",
        "-X DELETE",
        "/v1/queue/pause",
    ):  # submit, watch, cancel
        assert part in walked, f"the walk-through no longer runs {part!r}"
    assert (tmp_path / "fox.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the result it saved is a PNG


def test_a_transcript_reads_commands_and_their_output():
    """The transcript reader pairs each command with the lines under it (so a missing output is caught)."""
    text = '$ curl -s URL/healthz\n{"ok":true}\n$ JOB=$(curl ...)\n$ curl -s URL/v1/queue\n{...}\n'
    assert transcript(text) == [
        ("curl -s URL/healthz", '{"ok":true}'),
        ("JOB=$(curl ...)", ""),
        ("curl -s URL/v1/queue", "{...}"),
    ]
