"""The peer's ``requirements`` of a block repo (``{"package": ">=1.2"}``): what a block and its descendants
declare (``_requirements``), what a saved repo records, and what this environment lacks of them.

A save records the requirements of the block and of every block inside it, one entry per package (two
specifiers of one package joined, as the peer joins them) and warns about the ones this environment does not
meet; a load refuses a repo whose requirements are not met, before its code runs.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from modular.errors import BlockRepoError

if TYPE_CHECKING:
    from modular.framework.block import ModularPipelineBlocks

__all__ = ["block_requirements", "check_requirements", "unmet_requirements"]

_OPERATORS = ("<", ">", "=", "!", "~")


def _specifier(wanted: Any) -> str:
    """``wanted`` as a specifier: ``""`` for any version; a bare version pins it, as the peer reads it."""
    spec = "" if wanted is None else str(wanted).strip()
    if spec and not spec.startswith(_OPERATORS):
        spec = f"=={spec}"
    return spec


def unmet_requirements(requirements: Mapping[str, Any]) -> list[str]:
    """One line for each requirement this environment does not meet (missing, other version, bad specifier)."""
    problems = []
    for package, wanted in requirements.items():
        spec = _specifier(wanted)
        try:
            installed = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{package}{spec} is not installed")
            continue
        try:
            allowed = SpecifierSet(spec)
        except InvalidSpecifier:
            problems.append(f"{package}: {spec!r} is not a version specifier")
            continue
        if not allowed.contains(installed, prereleases=True):
            problems.append(f"{package}{spec} is wanted, {installed} is installed")
    return problems


def check_requirements(requirements: Any, where: str) -> None:
    """A repo's recorded ``requirements`` hold in this environment; otherwise a :class:`BlockRepoError`."""
    if requirements is None:
        return
    if not isinstance(requirements, dict) or not all(isinstance(k, str) for k in requirements):
        msg = f"{where}: requirements must map package names to version specifiers (got {requirements!r})."
        raise BlockRepoError(msg)
    problems = unmet_requirements(requirements)
    if problems:
        msg = f"{where} needs packages this environment lacks: {'; '.join(problems)}. Install them first."
        raise BlockRepoError(msg)


def _blocks_within(
    block: ModularPipelineBlocks, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], ModularPipelineBlocks]]:
    yield path, block
    for name, child in block.sub_blocks.items():
        yield from _blocks_within(child, (*path, name))


def block_requirements(block: ModularPipelineBlocks) -> dict[str, str]:
    """The requirements ``block`` and every block inside it declare, one specifier per package.

    Raises:
        BlockRepoError: a ``_requirements`` that is no mapping of package names, or a specifier that is not
            one; the message names the block that declares it.
    """
    top = type(block).__name__
    found: dict[str, list[str]] = {}
    for path, inner in _blocks_within(block):
        declared = getattr(inner, "_requirements", None)
        if declared is None:
            continue
        label = f"{top}: block {'.'.join(path)!r} ({type(inner).__name__})" if path else top
        if not isinstance(declared, Mapping) or not all(isinstance(k, str) for k in declared):
            msg = f"{label}: _requirements must map package names to version specifiers (got {declared!r})."
            raise BlockRepoError(msg)
        for package, wanted in declared.items():
            spec = "" if wanted is None else str(wanted).strip()
            try:
                SpecifierSet(_specifier(spec))
            except InvalidSpecifier:
                msg = (
                    f"{label} requires {package} {spec!r}, which is not a version specifier; write one such "
                    f"as '>=2.0' (or '' for any version)."
                )
                raise BlockRepoError(msg) from None
            specs = found.setdefault(package, [])
            if spec and spec not in specs:
                specs.append(spec)
    return {package: _joined(specs) for package, specs in found.items()}


def _joined(specs: list[str]) -> str:
    if not specs:
        return ""
    if len(specs) == 1:
        return specs[0]
    return str(SpecifierSet(",".join(_specifier(spec) for spec in specs)))
