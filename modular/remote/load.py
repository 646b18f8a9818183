"""``ModularPipelineBlocks.from_pretrained``: a block class from a repo's code, in the peer's layout.

The layout is the peer's: ``modular_config.json`` has ``"auto_map": {"ModularPipelineBlocks":
"<module>.<ClassName>"}`` and the repo holds ``<module>.py``. Every check that does not need the code to run
(the config, the file, the class being defined there, the path staying inside the repo, trust) happens before
any of it runs; the code runs from the bytes read at the pinned revision; the modules are registered only
once the class proved to be a block and was built.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import posixpath
from typing import TYPE_CHECKING, Any

import attrs

from components.repo import subfolder_escape
from modular.errors import BlockCodeError, BlockRepoError
from modular.remote.code import RepoModules, parts_of
from modular.remote.code_files import read_code_files
from modular.remote.nesting import BlockRepoCycleError, loading_turn
from modular.remote.requirements import check_requirements
from modular.remote.source import CONFIG_NAME, BlockSource, RepoSnapshot, read_repo

if TYPE_CHECKING:
    from modular.framework.block import ModularPipelineBlocks

__all__ = ["load_block", "read_config"]

AUTO_MAP_KEY = "ModularPipelineBlocks"


def read_config(snapshot: RepoSnapshot) -> dict[str, Any]:
    """The repo's ``modular_config.json`` as a dict; a missing or unreadable one is a :class:`BlockRepoError`."""
    if snapshot.config is None:
        present = sorted(os.listdir(snapshot.folder)) if os.path.isdir(snapshot.folder) else []
        msg = (
            f"{snapshot.where} has no {CONFIG_NAME} in {snapshot.folder} (files there: {present}). A block repo "
            f"holds its code and a {CONFIG_NAME} naming it; write one with block.save_pretrained(folder)."
        )
        raise BlockRepoError(msg)
    try:
        config = json.loads(snapshot.config)
    except ValueError as error:
        msg = f"{snapshot.where}: {CONFIG_NAME} is not valid JSON ({error})."
        raise BlockRepoError(msg) from error
    if not isinstance(config, dict):
        msg = f"{snapshot.where}: {CONFIG_NAME} must hold a JSON object (got {type(config).__name__})."
        raise BlockRepoError(msg)
    return config


def _class_reference(config: dict[str, Any], cls: type, where: str) -> tuple[str, str]:
    """``(code_file, class_name)`` from ``auto_map``, the file checked to stay inside the repo."""
    auto_map = config.get("auto_map")
    keys = [cls.__name__, AUTO_MAP_KEY]
    if not isinstance(auto_map, dict) or not any(key in auto_map for key in keys):
        msg = (
            f"{where}: {CONFIG_NAME} must name the block's code as "
            f'"auto_map": {{"{AUTO_MAP_KEY}": "<module>.<ClassName>"}} (got auto_map={auto_map!r}).'
        )
        raise BlockRepoError(msg)
    reference = next(auto_map[key] for key in keys if key in auto_map)
    module, _, class_name = reference.rpartition(".") if isinstance(reference, str) else ("", "", "")
    if not module or not class_name.isidentifier():
        msg = f'{where}: auto_map entry {reference!r} must read "<module>.<ClassName>", e.g. "block.MyBlock".'
        raise BlockRepoError(msg)
    code_file = f"{module}.py"
    escape = subfolder_escape(code_file)  # the same rule as a component's subfolder: no root, drive or '..'
    if escape is not None:
        msg = (
            f"{where}: auto_map names the code file {code_file!r}, which is outside the repo ({escape}). The "
            f"code must be a file inside the repo; nothing was read or run."
        )
        raise BlockRepoError(msg)
    return posixpath.normpath(code_file.replace("\\", "/")), class_name


def _top_level_names(tree: ast.Module) -> tuple[set[str], list[str], bool]:
    """Names a module binds at top level, the classes among them, and whether it star-imports."""
    names: set[str] = set()
    classes: list[str] = []
    star = False
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            classes.append(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                star = star or alias.name == "*"
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return names, classes, star


def _read_code(snapshot: RepoSnapshot, code_file: str) -> RepoSnapshot:
    """The snapshot with the files the code can run read in: ``code_file`` and what it imports relatively."""
    if not os.path.lexists(os.path.join(snapshot.folder, *code_file.split("/"))):
        folder = snapshot.folder
        present = sorted(n for n in os.listdir(folder) if n.endswith(".py")) if os.path.isdir(folder) else []
        msg = (
            f"{snapshot.where}: {CONFIG_NAME} names the code file {code_file!r}, which is not in the repo "
            f"(Python files there: {present}). Add the file or fix auto_map."
        )
        raise BlockRepoError(msg)
    return attrs.evolve(snapshot, files=read_code_files(snapshot.folder, code_file, snapshot.where))


def _check_class_is_defined(snapshot: RepoSnapshot, code_file: str, class_name: str) -> None:
    """Without running the file: it parses, and binds ``class_name``."""
    path = os.path.join(snapshot.folder, *code_file.split("/"))
    try:
        tree = ast.parse(snapshot.files[code_file], filename=path)
    except SyntaxError as error:
        msg = f"{snapshot.where}: {code_file} is not valid Python ({error.msg}, line {error.lineno}); nothing ran."
        raise BlockCodeError(msg) from error
    names, classes, star = _top_level_names(tree)
    if class_name not in names and not star:
        msg = (
            f"{snapshot.where}: {CONFIG_NAME} names class {class_name!r}, which {code_file} does not define "
            f"(classes defined there: {classes}). Fix auto_map or the file; nothing ran."
        )
        raise BlockRepoError(msg)


def _check_block_kwargs(block_cls: type, kwargs: dict[str, Any], where: str) -> None:
    try:
        inspect.signature(block_cls).bind(**kwargs)
    except TypeError as error:
        msg = (
            f"{where}: {block_cls.__name__}{inspect.signature(block_cls)} does not take the keyword "
            f"arguments {sorted(kwargs)} ({error})."
        )
        raise TypeError(msg) from None


def load_block(
    cls: type[ModularPipelineBlocks],
    repo: str | os.PathLike,
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
    subfolder: str = "",
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    block_kwargs: dict[str, Any] | None = None,
) -> ModularPipelineBlocks:
    """The block a repo's code defines, built with ``block_kwargs``; see ``ModularPipelineBlocks.from_pretrained``."""
    if not isinstance(trust_remote_code, bool):  # a truthy "no" must not count as consent
        msg = f"trust_remote_code must be True or False (got {trust_remote_code!r} that is a {type(trust_remote_code).__name__})."
        raise TypeError(msg)
    snapshot = read_repo(
        repo, revision, subfolder, token=token, cache_dir=cache_dir, local_files_only=local_files_only
    )
    config = read_config(snapshot)
    code_file, class_name = _class_reference(config, cls, snapshot.where)
    if (
        not trust_remote_code
    ):  # before any code file is read: reading one is already trusting the repo's files
        path = os.path.join(snapshot.folder, *code_file.split("/"))
        msg = (
            f"{snapshot.where} holds custom code: loading it runs {path} (class {class_name}). Read that "
            f"file; if you trust it, pass trust_remote_code=True."
        )
        raise BlockRepoError(msg)
    snapshot = _read_code(snapshot, code_file)
    _check_class_is_defined(snapshot, code_file, class_name)
    check_requirements(config.get("requirements"), snapshot.where)
    content_hash = snapshot.content_hash
    parts = parts_of(code_file)
    modules = RepoModules(snapshot.files, snapshot.folder, content_hash)
    # The repo's own turn, not a global lock: its code may load other block repos (tests/modular/test_block_repo_nesting.py).
    with loading_turn(content_hash, snapshot.where):
        module = modules.registered(parts)
        if module is None:
            try:
                module = modules.run(parts)
            except BlockRepoCycleError:
                raise  # already names the whole chain
            except Exception as error:
                msg = f"{snapshot.where}: {code_file} failed to import: {type(error).__name__}: {error}"
                raise BlockCodeError(msg) from error
        block_cls = getattr(module, class_name, None)
        if not (isinstance(block_cls, type) and issubclass(block_cls, cls)):
            got = (
                f"class {class_name} with bases {tuple(base.__name__ for base in block_cls.__bases__)}"
                if isinstance(block_cls, type)
                else f"{type(block_cls).__name__} {block_cls!r}"
            )
            msg = (
                f"{snapshot.where}: {code_file}'s {class_name} must be a subclass of {cls.__name__} "
                f"(got {got}). Point auto_map at the block class."
            )
            raise BlockRepoError(msg)
        kwargs = dict(block_kwargs or {})
        _check_block_kwargs(block_cls, kwargs, snapshot.where)
        try:
            block = block_cls(**kwargs)
        except BlockRepoCycleError:
            raise
        except Exception as error:
            msg = f"{snapshot.where}: building {class_name}(**{kwargs!r}) failed: {type(error).__name__}: {error}"
            raise BlockCodeError(msg) from error
        modules.register()
    block.source = BlockSource(
        repo=snapshot.repo,
        revision=snapshot.revision,
        commit=snapshot.commit,
        content_hash=content_hash,
        code_file=code_file,
        class_name=class_name,
        subfolder=subfolder,
    )
    return block
