"""Running a block repo's code: its modules, executed from the bytes that were read and hashed.

Each module of the repo becomes a module named ``modular.remote.code.m<hash>.<path>``. They are executed
with the peer import mapping (``modular/remote/peer_imports.py``), and relative imports are answered from
the repo's own files, never from outside its folder. Nothing enters ``sys.modules`` until the caller has
checked the result and calls :meth:`RepoModules.register`; a failure leaves nothing behind. Code with the
same content hash is executed once per process and reused.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Mapping, Sequence

from modular.remote.peer_imports import mapped_builtins

__all__ = ["RepoModules", "module_prefix", "parts_of"]


def module_prefix(content_hash: str) -> str:
    """The package name under which the code of one content hash is loaded."""
    return f"{__name__}.m{content_hash[:16]}"


def parts_of(code_file: str) -> tuple[str, ...]:
    """``"sub/block.py"`` -> ``("sub", "block")``."""
    return tuple(code_file[: -len(".py")].split("/"))


class RepoModules:
    """The modules of one block repo snapshot, executed on demand from in-memory sources.

    Args:
        files: ``relative/path.py -> source bytes`` of every Python file of the snapshot.
        folder: The snapshot's folder (module ``__file__`` paths, so tracebacks show the lines).
        content_hash: Names the package the modules live under.
    """

    def __init__(self, files: Mapping[str, bytes], folder: str, content_hash: str) -> None:
        self._files = dict(files)
        self._folder = folder
        self._prefix = module_prefix(content_hash)
        self._loaded: dict[tuple[str, ...], types.ModuleType] = {}
        self._root = types.ModuleType(self._prefix)  # what `from . import x` reads x from at the repo root
        self._root.__path__ = [folder]
        self._root.__package__ = self._prefix

    def name_of(self, parts: tuple[str, ...]) -> str:
        return ".".join((self._prefix, *parts))

    def registered(self, parts: tuple[str, ...]) -> types.ModuleType | None:
        """The module, if an earlier load of the same content registered it."""
        return sys.modules.get(self.name_of(parts))

    def run(self, parts: tuple[str, ...]) -> types.ModuleType:
        """Execute the module ``parts`` (and whatever it imports from the repo); not registered yet."""
        return self._import_parts(parts, importer="the block repo")

    def register(self) -> None:
        """Enter every module executed so far into ``sys.modules`` (after the caller checked them)."""
        sys.modules.setdefault(self._prefix, self._root)
        for parts, module in self._loaded.items():
            sys.modules.setdefault(self.name_of(parts), module)

    # ----- finding and executing files -----
    def _kind(self, parts: tuple[str, ...]) -> str | None:
        path = "/".join(parts)
        if f"{path}.py" in self._files:
            return "module"
        if f"{path}/__init__.py" in self._files:
            return "package"
        if any(name.startswith(f"{path}/") for name in self._files):
            return "namespace"
        return None

    def _package(self, parts: tuple[str, ...]) -> types.ModuleType:
        """A folder without ``__init__.py`` (or the repo root): an empty package, as Python's namespace ones."""
        if not parts:
            return self._root
        if parts not in self._loaded:
            module = types.ModuleType(self.name_of(parts))
            module.__path__ = [os.path.join(self._folder, *parts)]
            module.__package__ = module.__name__
            self._loaded[parts] = module
        return self._loaded[parts]

    def _import_parts(self, parts: tuple[str, ...], importer: str) -> types.ModuleType:
        if parts in self._loaded:
            return self._loaded[parts]
        kind = self._kind(parts)
        if kind is None:
            dotted = ".".join(parts)
            msg = (
                f"{importer} imports {dotted!r}, which the block repo does not have: no {'/'.join(parts)}.py "
                f"in {self._folder}. Add the file to the repo, or import an installed package instead."
            )
            raise ModuleNotFoundError(msg, name=dotted)
        parent = self._import_parts(parts[:-1], importer) if len(parts) > 1 else self._root
        if kind == "namespace":
            module = self._package(parts)
        else:
            module = self._execute(parts, is_package=kind == "package")
        setattr(parent, parts[-1], module)
        return module

    def _execute(self, parts: tuple[str, ...], is_package: bool) -> types.ModuleType:
        relative = "/".join(parts) + ("/__init__.py" if is_package else ".py")
        module = types.ModuleType(self.name_of(parts))
        module.__file__ = os.path.join(self._folder, *relative.split("/"))
        package_parts = parts if is_package else parts[:-1]
        module.__package__ = self.name_of(package_parts)
        if is_package:
            module.__path__ = [os.path.join(self._folder, *parts)]

        def relative_import(name: str, fromlist: Sequence[str] | None, level: int) -> types.ModuleType:
            return self._relative_import(relative, package_parts, name, fromlist, level)

        module.__builtins__ = mapped_builtins(relative, relative_import)  # type: ignore[attr-defined]
        # dont_inherit: this file's own `from __future__` imports must not change how the repo's code compiles.
        code = compile(self._files[relative], module.__file__, "exec", dont_inherit=True)
        self._loaded[parts] = module  # before running, as the import system does, for circular imports
        try:
            exec(code, module.__dict__)
        except BaseException:
            del self._loaded[parts]
            raise
        return module

    def _relative_import(
        self,
        importer: str,
        package: tuple[str, ...],
        name: str,
        fromlist: Sequence[str] | None,
        level: int,
    ) -> types.ModuleType:
        statement = f"from {'.' * level}{name} import {', '.join(fromlist or ())}"
        if level - 1 > len(package):
            msg = (
                f"{importer}: {statement!r} reaches above the block repo's folder {self._folder}. A block repo's "
                f"code may import only files inside its folder."
            )
            raise ImportError(msg, name=name)
        base = package[: len(package) - (level - 1)]
        parts = base + tuple(name.split(".")) if name else base
        module = self._import_parts(parts, importer) if parts else self._package(())
        for item in fromlist or ():
            if item != "*" and not hasattr(module, item) and self._kind((*parts, item)) is not None:
                setattr(module, item, self._import_parts((*parts, item), importer))
        return module
