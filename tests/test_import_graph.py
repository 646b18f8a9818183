"""The layering of docs/architecture.md, read from the source: every import of a project module, checked.

Imports are read with `ast` (nothing is imported), at module level and inside functions alike: a deferred
import still runs. Imports under ``if TYPE_CHECKING:`` are left out, since they never run (as import-linter's
``exclude_type_checking_imports`` leaves them out).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent

# The packages, lowest first: a package imports only itself and the packages before it.
PACKAGES = ["offload", "components", "modular", "blocks"]

# Inside a package, its parts (subpackages, or modules shared by all of them), lowest first: a part imports
# only itself and the parts before it. The package's `__init__` (its public face) and `__main__` import any.
PARTS = {
    "offload": [
        "_siblings",
        "lazy_exports",
        "errors",
        "devices",
        "strategies",
        "records",
        "weights",
        "partial",
        "host",
        "engine",
    ],
    "modular": [
        "_siblings",
        "errors",
        "logging",
        "families",
        "framework",
        "watch",
        "adapters",
        "pipeline",
        "remote",
        "batch",
        "serving",
        "http",
        "ray_serve",
        "cli",
    ],
}
FACES = {"__init__", "__main__"}

# A family imports blocks.common, itself, and the family it derives from.
BLOCKS_COMMON = "common"
DERIVES_FROM = {"stable_diffusion_xl": "stable_diffusion"}

# Upward imports kept on purpose, each deferred into the one function that needs it.
DEFERRED_UPWARD = {
    (
        "modular/framework/block.py",
        "modular.pipeline",
    ): "ModularPipelineBlocks.init_pipeline makes a pipeline",
    (
        "modular/framework/block.py",
        "modular.remote",
    ): "ModularPipelineBlocks.from_pretrained / save_pretrained",
}

# Optional libraries the test extra does not install: a public name that needs one may fail to import.
OPTIONAL_LIBRARIES = {"ray"}

# "About a dozen" modules per part, as the architecture page promises.
MAX_MODULES_PER_PART = 13


@attrs.frozen
class Import:
    """One import statement of a project module: where it is and what it names."""

    file: str  # the importing file, relative to the root
    line: int
    target: str  # the imported module, dotted (`offload.devices.units`)
    deferred: bool  # inside a function

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, deferred: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for orelse in child.orelse:
                yield from _walk(orelse, deferred)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, deferred
        inner = deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, inner)


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    """The project imports of one file (`source` stands in for the file's text in the tests of this test)."""
    tree = ast.parse(source if source is not None else path.read_text())
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    rel = str(path.relative_to(ROOT))
    found = []
    for node, deferred in _walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import module` names a module; `from module import name` names the module
            targets = [
                f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base for alias in node.names
            ]
        for target in dict.fromkeys(targets):
            if target.split(".")[0] in PACKAGES:
                found.append(Import(rel, node.lineno, target, deferred))
    return found


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def project_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _part(dotted: str) -> tuple[str, str | None]:
    """(package, part): the part is the first name below the package (None for the package itself)."""
    names = dotted.split(".")
    return names[0], names[1] if len(names) > 1 else None


def layering_problems(found: Import) -> list[str]:
    """Why one import breaks the layering, or nothing."""
    source = _module_name(ROOT / found.file)
    src_package, src_part = _part(source)
    dst_package, dst_part = _part(found.target)
    if PACKAGES.index(dst_package) > PACKAGES.index(src_package):
        return [
            f"{found}: `{src_package}` may not import `{dst_package}` (packages: {' -> '.join(reversed(PACKAGES))})"
        ]
    if dst_package != src_package:
        return []
    if src_package == "blocks":
        return _family_problems(found, src_part, dst_part)
    order = PARTS.get(src_package)
    if order is None or src_part in FACES or src_part is None or src_part == dst_part:
        return []
    unplaced = [part for part in (src_part, dst_part) if part is not None and part not in (*order, *FACES)]
    if unplaced:
        return [
            f"{found}: `{src_package}.{unplaced[0]}` has no place in PARTS[{src_package!r}]: place it in the layers"
        ]
    if dst_part is None or dst_part in FACES:
        if found.deferred:  # the public names, looked up when called (the peer-name map does so)
            return []
        return [
            f"{found}: a part of `{src_package}` imports the package's public face; import the module itself"
        ]
    if order.index(dst_part) > order.index(src_part):
        allowed = (found.file, f"{dst_package}.{dst_part}")
        if found.deferred and allowed in DEFERRED_UPWARD:
            return []
        lower = ", ".join(order[: order.index(src_part)]) or "nothing"
        return [f"{found}: `{src_package}.{src_part}` may import only {lower} of {src_package}"]
    return []


def _family_problems(found: Import, family: str | None, target: str | None) -> list[str]:
    if family in (None, *FACES) or target == family:
        return []
    if family == BLOCKS_COMMON:
        return [f"{found}: blocks.common is shared by every family and imports none of them"]
    if target == BLOCKS_COMMON or (target is not None and DERIVES_FROM.get(family) == target):
        return []
    return [
        f"{found}: the family `blocks.{family}` may import blocks.common, itself and the family it derives from"
    ]


@functools.cache
def all_imports() -> list[Import]:
    return [found for path in project_files() for found in imports_of(path)]


def test_the_graph_is_read_from_the_source():
    """The reader finds imports of every kind (so the checks below check something)."""
    found = all_imports()
    assert len(found) > 500
    assert any(item.deferred for item in found)
    assert any(item.target == "offload.devices.units" for item in found)


def test_no_import_breaks_the_layering():
    """Packages import downward only; inside offload and modular, each part imports only the parts below it."""
    problems = [problem for found in all_imports() for problem in layering_problems(found)]
    assert problems == []


def test_each_kept_upward_import_is_still_there_and_deferred():
    """An allowance that nothing uses any more goes; one that became a module-level import is a cycle."""
    found = all_imports()
    for file, target in DEFERRED_UPWARD:
        uses = [item for item in found if item.file == file and (item.target + ".").startswith(target + ".")]
        assert uses, f"{file} no longer imports {target}: remove it from DEFERRED_UPWARD"
        assert all(item.deferred for item in uses), [str(item) for item in uses if not item.deferred]


def test_no_circle_between_parts():
    """Between the parts of a package the module-level imports form no circle (deferred ones run after import)."""
    edges: dict[str, set[str]] = {}
    for found in all_imports():
        (src_package, src_part), (dst_package, dst_part) = (
            _part(_module_name(ROOT / found.file)),
            _part(found.target),
        )
        parts = {src_part, dst_part}
        if (
            not found.deferred
            and src_package == dst_package
            and src_part != dst_part
            and not parts & {None, *FACES}
        ):
            edges.setdefault(f"{src_package}.{src_part}", set()).add(f"{dst_package}.{dst_part}")
    assert len(edges) >= 10  # the parts do import each other: the walk below has a graph to walk
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            circles.append(" -> ".join([*trail[trail.index(node) :], node]))
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, [*trail, node])

    for start in sorted(edges):
        visit(start, [])
    assert circles == []


def test_every_part_is_placed_documented_and_small():
    """Each subpackage is in the layer order, says in its docstring what lives there, and holds about a dozen modules."""
    for package, order in PARTS.items():
        for folder in sorted(p for p in (ROOT / package).iterdir() if (p / "__init__.py").is_file()):
            assert folder.name in order, (
                f"{package}/{folder.name} is not in PARTS[{package!r}]: place it in the layers"
            )
            doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
            assert doc and "import" in doc.lower(), (
                f"{package}/{folder.name}/__init__.py: say what lives there and what it imports"
            )
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            assert len(modules) <= MAX_MODULES_PER_PART, (
                f"{package}/{folder.name} holds {len(modules)} modules"
            )
        for module in (ROOT / package).glob("*.py"):
            assert module.stem in (*order, *FACES), f"{package}/{module.name} is not in PARTS[{package!r}]"
        for name in order:
            assert (ROOT / package / name).is_dir() or (ROOT / package / f"{name}.py").is_file(), name


@pytest.mark.parametrize(
    ("file", "source", "expected"),
    [
        (
            "offload/devices/units.py",
            "from offload.engine.engine import OffloadEngine",
            "may import only _siblings, lazy_exports, errors",
        ),
        (
            "offload/engine/hook.py",
            "from components import ComponentsManager",
            "`offload` may not import `components`",
        ),
        ("offload/weights/ledger.py", "from offload import ResidencyLedger", "public face"),
        (
            "modular/framework/steps.py",
            "def f():\n    from modular.cli import main",
            "may import only _siblings, errors",
        ),
        (
            "modular/framework/block.py",
            "from modular.pipeline.pipeline import ModularPipeline",
            "may import only",
        ),
        ("blocks/common/vae.py", "from blocks.flux.utils import x", "imports none of them"),
        ("blocks/flux/denoise.py", "from blocks.stable_diffusion.utils import x", "the family `blocks.flux`"),
        ("components/spec.py", "import modular.pipeline.pipeline", "`components` may not import `modular`"),
        ("offload/newcomer.py", "from offload.devices.units import x", "`offload.newcomer` has no place"),
    ],
)
def test_each_rule_names_the_offending_import(file, source, expected):
    """A breaking import is reported with its file, line and the rule (the checks above can fail)."""
    problems = [p for found in imports_of(ROOT / file, source) for p in layering_problems(found)]
    assert len(problems) == 1 and expected in problems[0] and f"{file}:" in problems[0], problems


@pytest.mark.parametrize(
    ("file", "source"),
    [
        ("modular/framework/block.py", "def init_pipeline():\n    from modular.pipeline.pipeline import P"),
        (
            "offload/engine/hook.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from components import C",
        ),
        ("blocks/stable_diffusion_xl/denoise.py", "from blocks.stable_diffusion.denoise import x"),
        ("modular/cli/main.py", "from modular.framework.block import B"),
    ],
)
def test_allowed_imports_pass(file, source):
    """Downward, type-only, derived-family and kept deferred imports are not reported."""
    assert [p for found in imports_of(ROOT / file, source) for p in layering_problems(found)] == []


def test_every_name_a_package_exports_resolves():
    """Each name in a package's `__all__` imports (the lazy faces map names to modules by text: a typo there
    shows only here), but for those needing an optional library the test extra leaves out (Ray)."""
    import importlib

    faces = sorted(_module_name(path) for path in project_files() if path.name == "__init__.py")
    broken = []
    for face in faces:
        package = importlib.import_module(face)
        for name in getattr(package, "__all__", ()):
            try:
                getattr(package, name)
            except ImportError as error:
                if (error.name or "").split(".")[0] not in OPTIONAL_LIBRARIES:
                    broken.append(f"{face}.{name}: {error}")
            except AttributeError as error:
                broken.append(f"{face}.{name}: {error}")
    assert len(faces) > 10 and broken == []
