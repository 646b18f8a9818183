"""Runs a guide's examples and checks that every output it shows is what they print.

A guide is Markdown. Its ```python blocks run in order, in one namespace, one top-level statement at a
time, with stdout captured. Two kinds of shown output are compared with doctest's ``OutputChecker``
(``ELLIPSIS``: ``...`` stands for any text, absolute temp paths and ids included; ``NORMALIZE_WHITESPACE``:
runs of spaces and line breaks compare equal, so aligned columns may be any width):

- The trailing comment of a ``print(...)`` call is the output of the top-level statement holding it:
  ``print(len(ids))  # 3``, or a ``try`` whose ``except`` prints the error. Prose about a print goes on
  the line above it; a trailing comment on any other line is prose and is not compared. A comment the
  check cannot place is refused: on a print inside a ``def`` (it prints when called), or on one of
  several prints of one statement.
- A ```text block is the output of the ```python block just before it (prose may stand between them,
  no other fenced block): everything that block printed. A ```text block that shows no output (a
  sketch, code that needs a real GPU or the hub) carries ``<!-- not output -->`` on the line before its
  fence; an unmarked ```text block after anything but a ```python block is refused, so none goes
  unchecked.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import attrs

__all__ = ["NOT_OUTPUT", "Fence", "ShownOutputError", "fences", "matches", "run_guide", "run_guide_text"]

NOT_OUTPUT = "<!-- not output -->"
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_CHECKER = doctest.OutputChecker()
_OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


class ShownOutputError(AssertionError):
    """A guide shows an output its code does not print, or shows text the check cannot place."""


@attrs.frozen
class Fence:
    """One fenced block of a guide: its language, its text, the line of its first text line, and
    whether the line before its fence says it shows no output."""

    language: str
    text: str
    line: int
    not_output: bool


def fences(text: str) -> list[Fence]:
    """The fenced blocks of Markdown ``text``, in order."""
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        line = text.count("\n", 0, match.start()) + 2
        found.append(Fence(match.group(1), match.group(2), line, before == NOT_OUTPUT))
    return found


def matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is what ``shown`` shows (``...`` for any text, whitespace runs equal)."""
    return _CHECKER.check_output(shown.strip() + "\n", printed.strip() + "\n", _OPTIONS)


def run_guide(path: Path) -> dict:
    """Run the guide at ``path`` in the current folder and check what it shows; returns its namespace."""
    return run_guide_text(path.read_text(), path.name)


def run_guide_text(text: str, name: str) -> dict:
    """Run Markdown ``text`` (named ``name`` in errors) and check every output it shows."""
    namespace: dict = {"__name__": f"docs_{Path(name).stem}"}
    problems: list[str] = []  # every mismatch of the guide, reported at once
    previous: Fence | None = None
    printed = ""
    for fence in fences(text):
        if fence.language == "python":
            printed = _run_block(fence, namespace, name, problems)
        elif fence.language == "text" and not fence.not_output:
            where = f"{name}:{fence.line - 1}"  # its opening fence
            if previous is None or previous.language != "python":
                msg = (
                    f"{where}: a ```text block that follows no ```python block shows nothing the check can run; "
                    f"put {NOT_OUTPUT!r} on the line before its fence if it is not an output"
                )
                problems.append(msg)
            elif not matches(fence.text, printed):
                problems.append(
                    f"{where}: the ```text block is not what the block before it printed.\nShown:\n{fence.text}Printed:\n{printed}"
                )
        previous = fence
    if problems:
        raise ShownOutputError("\n\n".join(problems))
    return namespace


def _run_block(fence: Fence, namespace: dict, name: str, problems: list[str]) -> str:
    """Run one ```python block statement by statement, adding to ``problems`` each print whose trailing
    comment is not its output; return the block's stdout."""
    tree = ast.parse(fence.text, filename=name)
    ast.increment_lineno(tree, fence.line - 1)  # errors name the guide's own lines
    comments = dict(_trailing_comments(fence.text, fence.line - 1))
    block_output = io.StringIO()
    for statement in tree.body:
        expected = _expected_output(statement, comments, name, problems)
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            exec(compile(ast.Module([statement], type_ignores=[]), name, "exec"), namespace)
        output = captured.getvalue()
        block_output.write(output)
        if expected is not None and not matches(expected[1], output):
            line, shown = expected
            problems.append(f"{name}:{line}: the print shows {shown!r} but printed {output.rstrip()!r}")
    return block_output.getvalue()


def _expected_output(
    statement: ast.stmt, comments: dict[int, str], name: str, problems: list[str]
) -> tuple[int, str] | None:
    """(line, text) of the output ``statement`` shows in its print's trailing comment, if it shows one;
    a comment the check cannot place is added to ``problems``."""
    prints = [node for node in ast.walk(statement) if _is_print(node) and isinstance(node, ast.Call)]
    shown = [(node.end_lineno, comments[node.end_lineno]) for node in prints if node.end_lineno in comments]
    if not shown:
        return None
    line = shown[0][0]
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        problems.append(
            f"{name}:{line}: a print in a definition prints when called, so its trailing comment is not "
            "checked; print the call's result at the top level, or put the comment on the line above"
        )
        return None
    if len(prints) > 1:
        problems.append(
            f"{name}:{line}: a statement with several prints shows one's output in a trailing comment; "
            "give each its own top-level statement, or put the comment on the line above"
        )
        return None
    return shown[0]


def _is_print(node: ast.AST) -> bool:
    """Whether ``node`` is a ``print(...)`` expression statement or call."""
    call = node.value if isinstance(node, ast.Expr) else node
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"


def _trailing_comments(code: str, offset: int) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment that follows code on its line, lines counted from ``offset``."""
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT and token.line[: token.start[1]].strip():
            yield token.start[0] + offset, token.string.removeprefix("#").strip()
