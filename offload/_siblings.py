"""The sibling packages a package imports are this distribution's, not a file that shadows one.

The four packages have generic names: a user's ``offload.py`` in the working folder, or PyPI's
``components`` package, is found first by that name and the import fails deep inside, often as a
circular import. So each package checks the siblings it imports before it imports them
(``components/__init__.py``, ``modular/__init__.py``, ``blocks/__init__.py``, and ``modular/families.py``
before it loads a family's entry point). They run this file by its path (``runpy.run_path``): importing it
by name could find the shadow too. The standard library only, and each sibling is found, not imported: the
check is cheap (no torch).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable

__all__ = ["check_siblings"]

# pyproject.toml's project name: the distribution whose packages are ours, not the shadow's.
DISTRIBUTION = "modular-pipelines"
# The folder that holds the four packages (the repo root, or site-packages when installed).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_siblings(importer: str, siblings: Iterable[str]) -> None:
    """Raise ImportError naming the shadow and the fix if a sibling's name finds anything but ours.

    Args:
        importer: The package that imports the siblings (its ``__name__``), named in the message.
        siblings: Top-level names it imports. A name that is no package beside this one (a third
            party's family package) is not checked.
    """
    for name in siblings:
        ours = os.path.join(ROOT, name, "__init__.py")
        if not os.path.isfile(ours):
            continue
        found = _found_at(name)
        if found is None or os.path.realpath(found) == os.path.realpath(ours):
            continue
        raise ImportError(_message(importer, name, found), name=name, path=found)


def _found_at(name: str) -> str | None:
    """Where importing ``name`` would read it from (its file, or a namespace package's folder)."""
    try:
        spec = importlib.util.find_spec(name)
    except ValueError:  # already imported without a spec
        return getattr(sys.modules.get(name), "__file__", None)
    if spec is None:
        return None  # not found at all: the import itself says so
    if spec.origin and spec.origin != "namespace" and os.path.exists(spec.origin):
        return spec.origin
    return next(iter(spec.submodule_search_locations or ()), None)


def _message(importer: str, name: str, found: str) -> str:
    ours = os.path.join(ROOT, name)
    shadow = os.path.dirname(found) if os.path.basename(found) == "__init__.py" else found
    head = f"{importer} imports its sibling package {name!r} ({ours}), but the name {name!r} finds {shadow} first"
    other = _installed_by(name, shadow)
    if other is not None:
        return (
            f"{head}, installed by the distribution {other!r}: uninstall the other {name!r} package "
            f"(pip uninstall {other}), or give this project a virtual environment of its own"
        )
    kind = "file" if os.path.isfile(shadow) else "folder"
    return f"{head}: rename that {kind} (it shadows the package from the working folder or sys.path)"


def _installed_by(name: str, shadow: str) -> str | None:
    """The other distribution that installed ``shadow`` as its top-level ``name``, if one did."""
    from importlib import metadata  # only on the way to an error: it reads every distribution

    folder = os.path.realpath(os.path.dirname(shadow))
    for dist_name in metadata.packages_distributions().get(name, []):
        if dist_name.replace("_", "-").lower() == DISTRIBUTION:
            continue
        location = metadata.distribution(dist_name).locate_file("")
        if os.path.realpath(str(location)) == folder:
            return dist_name
    return None
