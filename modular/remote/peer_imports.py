"""The import mapping for block code written for the peer: ``diffusers.modular_pipelines`` names give ours.

A block published for diffusers' Modular Diffusers imports ``from diffusers.modular_pipelines import
ModularPipelineBlocks, InputParam, ...``. When this project runs such a file, those names must be this
project's classes, or the block would be a peer block that our pipelines cannot run.

Why a per-module ``__import__`` rather than an entry in ``sys.modules``: a module's import statements (at
load time and inside its functions, which keep the module's builtins) call the ``__import__`` found in the
module's own ``__builtins__``. Giving only the loaded block's modules a builtins mapping whose ``__import__``
answers ``diffusers`` imports with a view leaves ``sys.modules["diffusers..."]`` untouched, so the real
peer stays importable, unchanged, for every other module in the process (tests/modular/test_block_repo.py
``test_loading_a_peer_block_leaves_diffusers_untouched``). What it cannot see: code that imports through
``importlib.import_module`` instead of an import statement.
"""

from __future__ import annotations

import builtins
import importlib
import types
from collections.abc import Callable, Sequence
from typing import Any, Union

__all__ = ["PEER_NAMES", "PeerImportError", "PeerOnlyName", "mapped_builtins", "peer_name"]

#: The names of ``diffusers.modular_pipelines`` (and of top-level ``diffusers``) that mean this project's
#: class when a block repo's code imports them.
PEER_NAMES = (
    "AutoPipelineBlocks",
    "BlockState",
    "ComponentSpec",
    "ComponentsManager",
    "ConditionalPipelineBlocks",
    "ConfigSpec",
    "InputParam",
    "LoopSequentialPipelineBlocks",
    "ModularPipeline",
    "ModularPipelineBlocks",
    "OutputParam",
    "PipelineState",
    "SequentialPipelineBlocks",
)
_PEER_PACKAGE = "diffusers.modular_pipelines"
# The peer's submodules that hold those names: ``from diffusers.modular_pipelines.modular_pipeline_utils
# import InputParam`` is mapped too.
_PEER_SUBMODULES = ("modular_pipeline", "modular_pipeline_utils", "components_manager")


class PeerImportError(ImportError):
    """Block code imports a ``diffusers.modular_pipelines`` name this project has no counterpart for."""


def peer_name(name: str) -> Any:
    """This project's object for the peer name ``name`` (one of :data:`PEER_NAMES`)."""
    import modular

    return getattr(modular, name)


class _PeerModularPipelines(types.ModuleType):
    """What ``diffusers.modular_pipelines`` (and its submodules) are to mapped code: our classes."""

    __all__ = list(PEER_NAMES)  # `from diffusers.modular_pipelines import *`

    def __getattr__(self, name: str) -> Any:
        if name in PEER_NAMES:
            return peer_name(name)
        if name in _PEER_SUBMODULES:
            return self
        if _peer_has(self.__name__, name):
            return PeerOnlyName(name, self.__name__, "block code")
        raise AttributeError(_unknown_message(name, self.__name__))


class _PeerDiffusers(types.ModuleType):
    """What top-level ``diffusers`` is to mapped code: the real package, but its modular names are ours."""

    def __getattr__(self, name: str) -> Any:
        if name == "modular_pipelines":
            return _MODULAR_VIEW
        if name in PEER_NAMES:
            return peer_name(name)
        if _peer_only_class(name):
            return PeerOnlyName(name, "diffusers", "block code")
        return getattr(importlib.import_module("diffusers"), name)


class _PeerOnlyNames(types.ModuleType):
    """The module one ``from diffusers.modular_pipelines import ...`` statement reads its names from, when it
    names some of the peer's that this project does not map: those are :class:`PeerOnlyName`, the rest ours."""

    def __init__(self, module: str, where: str, peer_only: Sequence[str]) -> None:
        super().__init__(module)
        for name in peer_only:
            setattr(self, name, PeerOnlyName(name, module, where))

    def __getattr__(self, name: str) -> Any:
        return getattr(_MODULAR_VIEW, name)


_MODULAR_VIEW = _PeerModularPipelines(_PEER_PACKAGE, "This project's classes under the peer's names.")
_DIFFUSERS_VIEW = _PeerDiffusers("diffusers", "diffusers, with its modular names mapped to this project's.")


def _unknown_message(name: str, module: str) -> str:
    return (
        f"the block code imports {name!r} from {module}, which the peer does not have either; this project "
        f"maps only {list(PEER_NAMES)}. Check the name, or import other things from the project itself (a "
        f"family's blocks from blocks.<family>), or from diffusers' own modules outside diffusers.modular_pipelines."
    )


def _peer_has(module: str, name: str) -> bool:
    """Whether the peer's real ``module`` (``diffusers.modular_pipelines`` or a submodule) offers ``name``.

    Cheap once diffusers is imported (this project's components import it): the peer's package is lazy and
    lists its names without importing the families behind them.
    """
    try:
        real = importlib.import_module(module)
    except ImportError:
        return False
    return name in dir(real)


def _peer_only_class(name: str) -> bool:
    """A name top-level ``diffusers`` re-exports from its modular package (``FluxModularPipeline``) that this
    project does not map (its submodules, lower-case, are no such names)."""
    return name[:1].isupper() and name not in PEER_NAMES and _peer_has(_PEER_PACKAGE, name)


class PeerOnlyName:
    """What a name of the peer's ``diffusers.modular_pipelines`` that this project does not map is to block code.

    Block files import the peer's family pipelines (``WanModularPipeline``) for type hints, and helpers they
    may never call: the import works, and so do annotations (``WanModularPipeline | None``). Calling one,
    reading its attributes, subclassing it or an ``isinstance`` check against it raises :class:`PeerImportError`
    naming it, since this project has
    no counterpart to hand over.
    """

    __slots__ = ("_name", "_module", "_where")

    def __init__(self, name: str, module: str, where: str) -> None:
        self._name, self._module, self._where = name, module, where

    def _refuse(self, use: str) -> PeerImportError:
        msg = (
            f"{self._where}: {self._name!r} is the peer's ({self._module}), which this project does not map, so "
            f"it can be imported but not {use}. This project maps {list(PEER_NAMES)}; use one of those (a "
            f"family's pipeline is a ModularPipeline here), a family's blocks from blocks.<family>, or import "
            f"the peer's own class from outside block code."
        )
        return PeerImportError(msg, name=self._module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("called")

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):  # protocol look-ups (copy, pickle, typing) find nothing, as usual
            raise AttributeError(attribute)
        raise self._refuse(f"used (its attribute {attribute!r} was read)")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        raise self._refuse("subclassed")

    def __instancecheck__(self, instance: Any) -> bool:  # a False would silently take another branch
        raise self._refuse("used in isinstance")

    def __subclasscheck__(self, subclass: Any) -> bool:
        raise self._refuse("used in issubclass")

    def __or__(self, other: Any) -> Any:  # `WanModularPipeline | None` in an annotation
        return Union[self, other]  # noqa: UP007  (the operands are not types)

    def __ror__(self, other: Any) -> Any:
        return Union[other, self]  # noqa: UP007

    def __repr__(self) -> str:
        return f"<{self._module}.{self._name}: the peer's, not mapped here>"


def _in_peer_package(name: str) -> bool:
    return name == _PEER_PACKAGE or any(name == f"{_PEER_PACKAGE}.{sub}" for sub in _PEER_SUBMODULES)


def _import_diffusers(name: str, fromlist: Sequence[str] | None, where: str) -> types.ModuleType:
    """The answer to an absolute import of ``diffusers`` or one of its submodules from mapped code."""
    if name.startswith(_PEER_PACKAGE) and not _in_peer_package(name):
        msg = f"{where}: {_unknown_message(name.rsplit('.', 1)[-1], _PEER_PACKAGE)}"
        raise PeerImportError(msg, name=name)
    if _in_peer_package(name):
        if not fromlist:  # `import diffusers.modular_pipelines [as mp]` binds the top-level package
            return _DIFFUSERS_VIEW
        unknown = [n for n in fromlist if n != "*" and n not in PEER_NAMES and n not in _PEER_SUBMODULES]
        missing = [n for n in unknown if not _peer_has(name, n)]
        if missing:
            msg = f"{where}: {_unknown_message(missing[0], name)}"
            raise PeerImportError(msg, name=name)
        if unknown:  # the peer's names without a counterpart here: importable, refused when used
            return _PeerOnlyNames(name, where, unknown)
        return _MODULAR_VIEW
    real = importlib.import_module(name)  # `import diffusers.models` loads the submodule as usual
    if fromlist:
        if name == "diffusers" and any(
            n in PEER_NAMES or n == "modular_pipelines" or _peer_only_class(n) for n in fromlist
        ):
            return _DIFFUSERS_VIEW
        return real
    return _DIFFUSERS_VIEW


ImportHook = Callable[[str, Sequence[str] | None, int], types.ModuleType]


def mapped_builtins(where: str, relative_import: ImportHook) -> dict[str, Any]:
    """A ``__builtins__`` mapping for one module of block code.

    Args:
        where: Names the module in error messages (its file in the repo).
        relative_import: ``relative_import(name, fromlist, level)`` answers ``from .x import y`` (level >= 1)
            from the block repo's own files.
    """

    def import_for_block_code(
        name: str,
        globals: dict[str, Any] | None = None,  # noqa: A002  (the signature of builtins.__import__)
        locals: dict[str, Any] | None = None,  # noqa: A002
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        if level > 0:
            return relative_import(name, fromlist, level)
        if name == "diffusers" or name.startswith("diffusers."):
            return _import_diffusers(name, fromlist, where)
        return builtins.__import__(name, globals, locals, fromlist or (), level)

    mapping = dict(vars(builtins))
    mapping["__import__"] = import_for_block_code
    return mapping
