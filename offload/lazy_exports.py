"""Public names that a package imports on first use (PEP 562), so that importing the package costs nothing.

Every package of the project re-exports names from its modules; most of them import torch or diffusers,
which take seconds. A package's ``__init__`` lists where each name lives and binds the module-level
``__getattr__`` and ``__dir__`` this returns; ``if TYPE_CHECKING:`` imports of the same names give type
checkers the real types. Lives in ``offload``, the bottom layer, so that every package may use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names ``exports[module]`` live in ``module``.

    ``module`` is relative to the package (``".engine.engine"``). A name is imported on its first use and then kept
    in the package's namespace (later uses are plain attribute reads); a submodule that is not imported yet
    is imported when named, as ``package.submodule``.
    """
    where = {name: module for module, names in exports.items() for name in names}

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
