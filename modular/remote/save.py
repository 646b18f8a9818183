"""``block.save_pretrained(folder)``: a block class's code and ``modular_config.json``, in the peer's layout.

The class's module file is copied, with the files it imports relatively (``from .helpers import f``): those
are copied too, keeping their place next to it. A relative import that climbs above the module's folder
(``from ..pkg import f``) is refused, since the saved repo could not hold that file where the import looks.
Absolute imports are left as they are: they must be importable wherever the block is loaded.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import diffusers

from modular.errors import BlockRepoError
from modular.remote.load import AUTO_MAP_KEY
from modular.remote.requirements import block_requirements, unmet_requirements
from modular.remote.source import CONFIG_NAME

if TYPE_CHECKING:
    from modular.framework.block import ModularPipelineBlocks

__all__ = ["save_block"]

logger = logging.getLogger(__name__)


def _module_file(block: ModularPipelineBlocks) -> str:
    """The source file that defines ``type(block)``, refused when loading it again could not work."""
    cls = type(block)
    name = cls.__name__
    if cls.__module__.startswith("modular.framework."):
        msg = (
            f"{name} cannot be saved as a block repo: it is this project's own {name}, made with from_blocks_dict "
            f"or built in code, so its sub-blocks live in this instance, not in code a repo can hold. Define a "
            f"class of your own in a module: class MyBlocks({name}): block_classes = [...]; block_names = "
            f"[...], and save an instance of it."
        )
        raise BlockRepoError(msg)
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if cls.__module__ == "__main__" or not file or not file.endswith(".py") or not os.path.isfile(file):
        msg = (
            f"{name} cannot be saved as a block repo: it is defined in {cls.__module__!r}, which has no module "
            f"file to copy (a script run as __main__, an interactive session, or code run with exec). Move the "
            f"class into a module of its own (e.g. my_block.py), import it from there and save that."
        )
        raise BlockRepoError(msg)
    if "<locals>" in cls.__qualname__ or getattr(module, name, None) is not cls:
        msg = (
            f"{name} cannot be saved as a block repo: {file} does not define it at top level as {name!r} "
            f"(its qualified name is {cls.__qualname__!r}), so loading the file could not find it. Define "
            f"the class at the top level of its module."
        )
        raise BlockRepoError(msg)
    return file


def _relative_targets(folder: Path, relative: str, tree: ast.Module, main: str) -> list[str]:
    """The repo files that ``relative``'s relative imports read, each checked to lie below ``folder``."""
    package = relative.split("/")[:-1]  # a module's package, and an __init__.py's own folder
    targets = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        statement = f"from {'.' * node.level}{node.module or ''} import ..."
        if node.level - 1 > len(package):
            msg = (
                f"{main} cannot be saved as a block repo: {relative} line {node.lineno} ({statement!r}) imports "
                f"from above {folder}, and the saved repo can hold only files next to or below {main}. Make it "
                f"an absolute import of an installed package, or move the imported file next to {main}."
            )
            raise BlockRepoError(msg)
        base = package[: len(package) - (node.level - 1)]
        parts = base + (node.module.split(".") if node.module else [])
        found = False
        for depth in range(len(base) + 1, len(parts) + 1):  # the packages on the way, then the module
            stem = "/".join(parts[:depth])
            for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
                if (folder / candidate).is_file():
                    targets.append(candidate)
                    found = True
        if node.module is None or (folder / "/".join(parts)).is_dir():
            for alias in node.names:  # `from . import helpers`: the names may be modules
                stem = "/".join([*parts, alias.name])
                for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
                    if (folder / candidate).is_file():
                        targets.append(candidate)
                        found = True
        if not found and not (folder / "/".join(parts)).is_dir():
            msg = (
                f"{main} cannot be saved as a block repo: {relative} line {node.lineno} ({statement!r}) imports "
                f"a file that is not in {folder}."
            )
            raise BlockRepoError(msg)
    return targets


def code_files(module_file: str) -> dict[str, Path]:
    """``relative path -> source path``: the module file and every file it imports relatively, transitively."""
    folder = Path(module_file).parent
    main = Path(module_file).name
    files: dict[str, Path] = {}
    pending = [main]
    while pending:
        relative = pending.pop()
        if relative in files:
            continue
        path = folder / relative
        files[relative] = path
        tree = ast.parse(path.read_bytes(), filename=str(path))
        pending.extend(_relative_targets(folder, relative, tree, main))
    return files


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def save_block(block: ModularPipelineBlocks, save_directory: str | os.PathLike) -> None:
    """Write ``type(block)``'s code and a ``modular_config.json`` naming it into ``save_directory``.

    Only the files it writes are added or replaced. Everything is checked before anything is written, and
    the config is written last, so a folder never names code it lacks.
    """
    module_file = _module_file(block)
    cls = type(block)
    files = code_files(module_file)
    target = Path(save_directory)
    if not str(save_directory) or target.is_file():
        msg = f"save_pretrained needs a folder to write {cls.__name__}'s block repo into (got {str(save_directory)!r})."
        raise BlockRepoError(msg)
    requirements = block_requirements(block)
    unmet = unmet_requirements(requirements)
    if unmet:  # the repo is for where they hold; say so now rather than at the first load elsewhere
        logger.warning(
            "%s is saved with requirements this environment does not meet: %s. Loading the repo refuses "
            "until they are met.",
            cls.__name__,
            "; ".join(unmet),
        )
    config: dict[str, object] = {
        "_class_name": cls.__name__,
        "_diffusers_version": diffusers.__version__,
        "auto_map": {AUTO_MAP_KEY: f"{Path(module_file).stem}.{cls.__name__}"},
    }
    if requirements:
        config["requirements"] = requirements
    for relative, source in files.items():
        destination = target / relative
        if destination.exists() and os.path.samefile(destination, source):
            continue  # saving back into the folder the code lives in
        _write_whole(destination, source.read_bytes())
    _write_whole(target / CONFIG_NAME, (json.dumps(config, indent=2) + "\n").encode())
