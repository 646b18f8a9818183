"""Run the peer's (diffusers') modular family test suites against this project's families.

    python scripts/peer_suite.py --diffusers /path/to/diffusers [--families flux,z_image] [-- -x -k batch]

``--diffusers`` is a diffusers git directory (bare or a clone; files are read with ``git show REV:path``)
or a plain checkout. The script writes, into a temporary folder, the peer's ``tests/testing_utils.py``,
``tests/conftest.py``, ``tests/modular_pipelines/testing_utils/`` and each chosen family's test folder, laid
out as the same package tree so their relative imports work. In every copied file it rewrites:

- imports of the peer's framework names (``ModularPipeline``, ``ComponentsManager``, ...) to ``modular``'s;
- imports of the peer's family classes to ours, through the explicit table ``FAMILIES``
  (``scripts/peer_families.py``; a name with no counterpart is left to the peer, reported, and the test
  classes built on such blocks are skipped);
- each test config's ``pretrained_model_name_or_path`` to the path of our family's tiny repo
  (``FAMILY.make_tiny_repo``), since the hub's test repos cannot be reached offline;
- an import of a helper from another of the peer's test modules (SDXL's ``create_ip_adapter_state_dict``)
  to a module holding only the named definitions, extracted from the peer's source.

Then it runs pytest on that folder with this project's Python (``HF_HUB_OFFLINE=1``, this checkout first
on ``sys.path``) and prints, per family, the counts passed / failed / skipped / errors and the first line
of each failure's error. The exit status is 0 whenever the suite ran: failures are the report.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:  # its siblings, also when loaded by path (the tests)
    sys.path.insert(0, str(ROOT / "scripts"))

from peer_families import FAMILIES, FRAMEWORK_NAMES, SHARED_FILES, SHARED_FOLDER, PeerFamily  # noqa: E402
from peer_rewrite import (  # noqa: E402
    Rewrite,
    extract_definitions,
    helper_imports,
    rewrite_imports,
    substitute_repos,
)

__all__ = [
    "FAMILIES",
    "FRAMEWORK_NAMES",
    "PeerFamily",
    "PeerSource",
    "Rewrite",
    "build_tree",
    "choose_families",
    "extract_definitions",
    "helper_imports",
    "main",
    "parse_junit",
    "report",
    "rewrite_imports",
    "run_pytest",
    "substitute_repos",
]

# ----- reading the peer -----


class PeerSource:
    """The peer's files: from a git directory at ``rev`` (``git show``), or from a checkout on disk."""

    def __init__(self, location: Path, rev: str = "HEAD") -> None:
        self.location = location
        self.rev = rev
        self.git = _is_git_dir(location)

    def read(self, path: str) -> str | None:
        if not self.git:
            file = self.location / path
            return file.read_text() if file.is_file() else None
        done = subprocess.run(
            ["git", "-C", str(self.location), "show", f"{self.rev}:{path}"], capture_output=True, text=True
        )
        return done.stdout if done.returncode == 0 else None

    def listdir(self, folder: str) -> list[str]:
        """Paths of the files directly in ``folder``."""
        if not self.git:
            base = self.location / folder
            if not base.is_dir():
                return []
            return sorted(f"{folder}/{p.name}" for p in base.iterdir() if p.is_file())
        done = subprocess.run(
            ["git", "-C", str(self.location), "ls-tree", "--name-only", f"{self.rev}:{folder}"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return []
        names = [line for line in done.stdout.splitlines() if line]
        return sorted(f"{folder}/{n}" for n in names if self.read(f"{folder}/{n}") is not None)


def _is_git_dir(location: Path) -> bool:
    if (location / "tests").is_dir():
        return False  # a checkout: read its files as they are on disk
    done = subprocess.run(
        ["git", "-C", str(location), "rev-parse", "--git-dir"], capture_output=True, text=True
    )
    return done.returncode == 0


# ----- the conftest, pytest, the report -----

CONFTEST = '''"""Written by scripts/peer_suite.py: registers our families (an editable install's entry points may
predate a family), and skips the test classes built on a peer blocks class we do not map."""

import importlib

import pytest

for package in PACKAGES:
    family = getattr(importlib.import_module(package), "FAMILY", None)
    if family is not None:
        import modular

        modular.register_family(family)


def pytest_collection_modifyitems(config, items):
    for item in items:
        blocks = getattr(item.cls, "pipeline_blocks_class", None)
        if isinstance(blocks, type) and blocks.__module__.startswith("diffusers"):
            reason = f"no counterpart here: the peer's {blocks.__name__}"
            item.add_marker(pytest.mark.skip(reason=reason))
'''

MARKER = ".peer-suite"  # in every tree this script writes: --keep empties only such a folder
PYTEST_INI = "[pytest]\naddopts = -p no:cacheprovider\n"


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    reasons: dict[str, str] = field(default_factory=dict)  # failed or erroring test -> first line
    skip_reasons: collections.Counter = field(default_factory=collections.Counter)

    def line(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped, {self.errors} errors"


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def family_of(classname: str, name: str, folders: Mapping[str, str]) -> str:
    """The family (key of ``folders``: family -> peer folder) a junit test case belongs to."""
    for text in (classname, name):
        parts = text.replace("/", ".").split(".")
        for i, part in enumerate(parts[:-1]):
            if part == "modular_pipelines":
                for family, folder in folders.items():
                    if parts[i + 1] == folder:
                        return family
    return "?"


def parse_junit(path: Path, folders: Mapping[str, str]) -> dict[str, Counts]:
    """Counts per family from a pytest ``--junitxml`` report; ``folders`` maps family -> peer folder."""
    counts: dict[str, Counts] = {family: Counts() for family in folders}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        family = family_of(classname, name, folders)
        tally = counts.setdefault(family, Counts())
        test = f"{classname.rsplit('.', 1)[-1]}::{name}" if classname else name
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failure is not None or error is not None:
            element = failure if failure is not None else error
            assert element is not None
            if failure is not None:
                tally.failed += 1
            if error is not None:
                tally.errors += 1
            message = element.get("message") or element.text
            tally.reasons[test] = _first_line(message)
        elif skipped is not None:
            tally.skipped += 1
            tally.skip_reasons[_first_line(skipped.get("message"))] += 1
        else:
            tally.passed += 1
    return counts


def report(counts: Mapping[str, Counts]) -> str:
    lines = []
    for family, tally in counts.items():
        lines.append(f"{family}: {tally.line()}")
        for test, reason in sorted(tally.reasons.items()):
            lines.append(f"  FAIL {test}: {reason}")
        for reason, n in sorted(tally.skip_reasons.items()):
            lines.append(f"  skip x{n}: {reason}")
    return "\n".join(lines)


def run_pytest(
    folder: Path,
    targets: Sequence[str],
    extra: Sequence[str],
    junit: Path,
    env: Mapping[str, str] | None = None,
) -> int:
    """pytest on ``targets`` under ``folder`` with this project's Python, offline, this checkout importable
    (``env``: more environment variables)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", "--rootdir", str(folder), "-c", str(folder / "pytest.ini")]
    command += [f"--junitxml={junit}", *targets, *extra]
    return subprocess.run(command, cwd=folder, env=env).returncode


# ----- the tree -----


def _importable(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:
        return False


def choose_families(keys: Sequence[str] | None) -> tuple[list[PeerFamily], list[str]]:
    """The families to run and a line per family left out (unknown, not importable, nothing mapped)."""
    known = {family.name: family for family in FAMILIES}
    chosen, notes = [], []
    for key in keys or list(known):
        family = known.get(key)
        if family is None:
            notes.append(f"{key}: skipped, no row in scripts/peer_families.py FAMILIES")
        elif not _importable(family.package):
            notes.append(f"{key}: skipped, {family.package} is not importable")
        elif not family.names:
            notes.append(f"{key}: skipped, no peer names mapped to ours yet (FAMILIES)")
        else:
            chosen.append(family)
    return chosen, notes


def write_file(folder: Path, path: str, text: str) -> None:
    target = folder / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def build_tree(
    peer: PeerSource, folder: Path, families: Sequence[PeerFamily], repo_for: Callable[[PeerFamily, str], str]
) -> list[str]:
    """Write the peer's shared test files and the families' folders under ``folder``, rewritten, each config's
    repo id replaced by ``repo_for(family, id)``; returns notes (names left to the peer, substitutions)."""
    notes: list[str] = []
    shared = [*SHARED_FILES, *peer.listdir(SHARED_FOLDER)]
    if not any(p.endswith("/__init__.py") for p in shared if p.startswith(SHARED_FOLDER)):
        raise SystemExit(f"{peer.location}: no {SHARED_FOLDER}/ (is it a diffusers repository?)")
    for path in shared:
        text = peer.read(path)
        if text is None:
            text = ""  # an __init__.py the peer does not have
        if path.endswith(".py") and path != "tests/testing_utils.py":
            text = rewrite_imports(text, {}).source
        write_file(folder, path, text)
    helpers: dict[str, set[str]] = collections.defaultdict(set)
    for family in families:
        base = f"tests/modular_pipelines/{family.peer_folder}"
        files = peer.listdir(base)
        if not files:
            notes.append(f"{family.name}: the peer has no {base}/")
        texts: dict[str, str] = {}
        uses: dict[str, set[str]] = collections.defaultdict(set)
        lines: list[str] = []
        try:
            for path in files:
                text = peer.read(path) or ""
                if path.endswith(".py") and Path(path).name.startswith("test_"):
                    done = rewrite_imports(text, family.names)
                    text, substituted = substitute_repos(done.source, functools.partial(repo_for, family))
                    for module, names in helper_imports(text, path).items():
                        uses[module] |= names
                    if done.unmapped:
                        unmapped = ", ".join(sorted(set(done.unmapped)))
                        lines.append(f"{family.name}: left to the peer in {path}: {unmapped}")
                    lines.extend(f"{family.name}: {i} -> {repo}" for i, repo in sorted(set(substituted)))
                texts[path] = text
        except Exception as error:  # a tiny repo that cannot be made: the family is left out, saying why
            reason = f"{type(error).__name__}: {_first_line(str(error))}"
            notes.append(f"{family.name}: skipped, its tiny repo could not be made: {reason}")
            continue
        notes.extend(lines)
        for module, names in uses.items():
            helpers[module] |= names
        for path, text in texts.items():
            write_file(folder, path, text)
    for module, names in sorted(helpers.items()):
        if (folder / module).exists():
            continue
        text = peer.read(module)
        if text is None:
            notes.append(f"helper module {module} not found in the peer")
            continue
        write_file(folder, module, extract_definitions(text, names))
        package = Path(module).parent
        while package.parts and package != Path("tests"):
            if not (folder / package / "__init__.py").exists():
                write_file(folder, str(package / "__init__.py"), "")
            package = package.parent
        notes.append(f"helper {module}: {', '.join(sorted(names))} extracted")
    packages = [family.package for family in families]
    write_file(folder, "conftest.py", CONFTEST.replace("PACKAGES", repr(packages), 1))
    write_file(folder, "pytest.ini", PYTEST_INI)
    return notes


class TinyRepos:
    """Our tiny repo for a peer test repo id, made on first use under ``folder``: like the hub's
    ``tiny-*-modular`` test repos, a ``modular_model_index.json`` alone whose entries name another repo,
    here the tiny repo that the family's ``repos`` entry for that id (or ``FAMILY.make_tiny_repo``) writes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.made: dict[tuple[str, str, str], str] = {}
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        diffusers_logging.disable_progress_bar()  # the builders' saves; the tests' own bars are pytest's
        transformers_logging.disable_progress_bar()

    def __call__(self, family: PeerFamily, repo_id: str) -> str:
        builder, kwargs = family.repos.get(repo_id, ("", {}))
        key = (family.name, builder, repr(sorted(kwargs.items())))
        if key not in self.made:
            import modular

            if builder:
                module_name, _, function = builder.rpartition(".")
                make = getattr(importlib.import_module(module_name), function)
            else:
                make = importlib.import_module(family.package).FAMILY.make_tiny_repo
            name = f"{family.name}-{len(self.made)}"
            modular.register_family(importlib.import_module(family.package).FAMILY)
            tiny = make(self.folder / name, **kwargs)
            index_only = self.folder / f"{name}-modular"
            pipe = modular.ModularPipeline.from_pretrained(tiny)
            pipe.save_pretrained(index_only, overwrite_modular_index=False)
            self.made[key] = str(index_only)
        return self.made[key]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--diffusers", required=True, type=Path, help="a diffusers git directory or checkout")
    parser.add_argument("--rev", default="HEAD", help="the revision to read from a git directory")
    parser.add_argument("--families", help="comma-separated keys of FAMILIES (default: all)")
    parser.add_argument("--keep", type=Path, help="write the tree into this folder and keep it")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))  # this checkout's families, as pytest will see them
    families, notes = choose_families(args.families.split(",") if args.families else None)
    for note in notes:
        print(note)
    if not families:
        return 0
    folder = args.keep or Path(tempfile.mkdtemp(prefix="peer-suite-"))
    if args.keep and folder.exists() and any(folder.iterdir()):
        if not (folder / MARKER).exists():  # never empty a folder this script did not write
            parser.error(f"--keep {folder}: not empty and not a tree of this script's; name a new folder")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("written by scripts/peer_suite.py\n")
    try:
        peer = PeerSource(args.diffusers, args.rev)
        tree_notes = build_tree(peer, folder, families, TinyRepos(folder / "repos"))
        for note in tree_notes:
            print(note)
        notes += [note for note in tree_notes if "left to the peer" in note or "skipped" in note]
        families = [f for f in families if (folder / "tests/modular_pipelines" / f.peer_folder).is_dir()]
        if not families:
            return 0
        targets = [f"tests/modular_pipelines/{family.peer_folder}" for family in families]
        junit = folder / "report.xml"
        code = run_pytest(folder, targets, extra, junit)
        print(f"\npytest exited {code}")
        if junit.exists():
            print(report(parse_junit(junit, {f.name: f.peer_folder for f in families})))
        else:
            print("no report: pytest did not run the tests")
        for note in notes:
            print(note)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"tree kept in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
