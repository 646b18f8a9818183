"""Public names that a package imports on first use (PEP 562), so that importing the package costs nothing.

Every package of the project re-exports names from its modules; most of them import torch or diffusers,
which take seconds. A package's ``__init__`` imports those names under ``if TYPE_CHECKING:`` (so type
checkers and readers see the real names and where they live) and binds the module-level ``__getattr__`` and
``__dir__`` this returns, which read that same block: each name is written once, where it is imported. Lives
in ``offload``, the bottom layer, so that every package may use it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports", "typed_imports"]


def typed_imports(source: str) -> dict[str, str]:
    """``{name: module}`` of the ``from module import name`` statements under ``if TYPE_CHECKING:`` at the top
    level of ``source`` (a package's ``__init__``); a relative module keeps its dots (``".engine.engine"``)."""
    where = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for item in node.body:
                if not isinstance(item, ast.ImportFrom):
                    msg = (
                        f"only `from ... import ...` lines go under `if TYPE_CHECKING:` (line {item.lineno})"
                    )
                    raise SyntaxError(msg)
                module = "." * item.level + (item.module or "")
                where.update({alias.asname or alias.name: module for alias in item.names})
    return where


def lazy_exports(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``__init__`` (``init_file``) imports its public names
    under ``if TYPE_CHECKING:``.

    A name is imported on its first use and then kept in the package's namespace (later uses are plain
    attribute reads); a submodule that is not imported yet is imported when named, as ``package.submodule``.
    """
    with open(init_file, encoding="utf-8") as handle:
        where = typed_imports(handle.read())

    def __getattr__(name: str) -> Any:
        namespace = sys.modules[package].__dict__
        if name in where:
            value = getattr(importlib.import_module(where[name], package), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            msg = f"module {package!r} has no attribute {name!r}"
            raise AttributeError(msg)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*sys.modules[package].__dict__, *where})

    return __getattr__, __dir__
