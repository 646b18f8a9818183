"""The rewrites ``scripts/peer_suite.py`` makes in each of the peer's test files it copies: imports of the peer's
names to ours, test repo ids to our tiny repos, and imports of another test module's helpers to a module of
only those definitions."""

from __future__ import annotations

import ast
import collections
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from peer_families import FRAMEWORK_NAMES, SHARED_FOLDER


@dataclass
class Rewrite:
    """What a rewrite of one file did."""

    source: str
    mapped: list[str] = field(default_factory=list)  # peer names now ours
    unmapped: list[str] = field(default_factory=list)  # peer modular names left to the peer
    repos: int = 0  # pretrained_model_name_or_path values substituted


def _is_peer_module(module: str | None) -> bool:
    return module is not None and (module == "diffusers" or module.startswith("diffusers.modular_pipelines"))


def _looks_modular(name: str) -> bool:
    return name.endswith(("Blocks", "ModularPipeline", "Step")) or name in FRAMEWORK_NAMES


def _replace_lines(source: str, spans: Iterable[tuple[int, int, str]]) -> str:
    """``source`` with each (first line, last line, text) span (1-based, inclusive) replaced by ``text``."""
    lines = source.splitlines(keepends=True)
    for first, last, text in sorted(spans, reverse=True):
        lines[first - 1 : last] = [text]
    return "".join(lines)


def rewrite_imports(source: str, names: Mapping[str, str]) -> Rewrite:
    """Point ``from diffusers[.modular_pipelines...] import X`` at ours where ``names`` (peer name -> our
    dotted path) or the framework names have X; other names stay the peer's, and the modular-looking ones
    among them are reported as unmapped."""
    table = {name: f"modular.{name}" for name in FRAMEWORK_NAMES} | dict(names)
    result = Rewrite(source)
    spans = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level or not _is_peer_module(node.module):
            continue
        kept, ours = [], []
        for alias in node.names:
            target = table.get(alias.name)
            if target is None:
                kept.append(alias)
                if node.module != "diffusers" or _looks_modular(alias.name):
                    if alias.name != "*":
                        result.unmapped.append(alias.name)
            else:
                ours.append((alias, target))
                result.mapped.append(alias.name)
        if not ours:
            continue
        indent = " " * node.col_offset
        statements = []
        if kept:
            kept_names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in kept)
            statements.append(f"from {node.module} import {kept_names}")
        for alias, target in ours:
            module, _, attribute = target.rpartition(".")
            statements.append(f"from {module} import {attribute} as {alias.asname or alias.name}")
        text = "".join(f"{indent if i else ''}{s}\n" for i, s in enumerate(statements))
        first_indent = source.splitlines()[node.lineno - 1][: node.col_offset]
        spans.append((node.lineno, node.end_lineno or node.lineno, first_indent + text))
    result.source = _replace_lines(source, spans)
    return result


def substitute_repos(source: str, repo_for: Callable[[str], str]) -> tuple[str, list[tuple[str, str]]]:
    """Every class attribute ``pretrained_model_name_or_path = "<id>"`` set to ``repo_for(id)``; and the
    (id, repo) pairs substituted."""
    spans, done = [], []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id == "pretrained_model_name_or_path"
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                repo = repo_for(statement.value.value)
                done.append((statement.value.value, repo))
                line = source.splitlines()[statement.lineno - 1]
                indent = line[: statement.col_offset]
                text = f"{indent}pretrained_model_name_or_path = {repo!r}\n"
                spans.append((statement.lineno, statement.end_lineno or statement.lineno, text))
    return _replace_lines(source, spans), done


def helper_imports(source: str, path: str) -> dict[str, set[str]]:
    """The peer test modules (repository paths) that ``source`` (at ``path``) imports names from, relatively,
    outside the shared testing utils: {module path: names}."""
    package = path.rsplit("/", 1)[0].split("/")
    found: dict[str, set[str]] = collections.defaultdict(set)
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or not node.level or node.module is None:
            continue
        base = package[: len(package) - (node.level - 1)]
        target = "/".join([*base, *node.module.split(".")])
        if target in ("tests/testing_utils", SHARED_FOLDER) or target.startswith(SHARED_FOLDER + "/"):
            continue
        found[target + ".py"] |= {a.name for a in node.names}
    return dict(found)


def extract_definitions(source: str, names: Iterable[str]) -> str:
    """A module of ``source``'s absolute imports (each allowed to fail) and the top-level definitions of
    ``names``, with the top-level definitions they use."""
    tree = ast.parse(source)
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
    wanted: list[str] = []
    todo = [n for n in names if n in defined]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.append(name)
        used = {n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name)}
        todo.extend(sorted(used & set(defined) - set(wanted)))
    parts = ["# Extracted at run time by scripts/peer_suite.py from the peer's test module of this name.\n"]
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
            parts.append(f"try:\n    {ast.unparse(node)}\nexcept ImportError:\n    pass\n")
    order = {id(node): i for i, node in enumerate(tree.body)}
    chosen = sorted({id(defined[n]): defined[n] for n in wanted}.values(), key=lambda node: order[id(node)])
    parts.extend(ast.get_source_segment(source, node) + "\n" for node in chosen)  # type: ignore[operator]
    return "\n\n".join(parts)
