"""Which files of a block repo are read, and how: the named module and what it imports relatively, nothing else.

A block repo is read only after consent (``load.py``), and only the files its code can run: the module
``auto_map`` names, the ``__init__.py`` of the packages above it, and, file by file, what those import with
``from . import ...`` statements. Each is read as a regular file of bounded size: a FIFO, a device (a link to
``/dev/zero``), a directory or a dangling link is refused with the file named, never opened for a blocking
read, and a file past :data:`MAX_FILE_BYTES` is refused before it is read whole.
"""

from __future__ import annotations

import ast
import os
import stat

from modular.errors import BlockRepoError

__all__ = ["MAX_FILE_BYTES", "read_code_files", "read_regular_file"]

#: The largest code or config file a block repo may hold (the peer's blocks are a few kilobytes).
MAX_FILE_BYTES = 4 * 1024 * 1024

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def read_regular_file(path: str, where: str) -> bytes:
    """The bytes of ``path``, which must be a regular file (links to one are followed) of at most the limit.

    Raises:
        BlockRepoError: ``path`` is missing or a dangling link, is not a regular file, cannot be read, or holds
            more than :data:`MAX_FILE_BYTES` bytes; the message names the file and, for size, the limit.
    """
    limit = MAX_FILE_BYTES
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        what = "a link to a file that does not exist" if os.path.islink(path) else "missing"
        msg = f"{where}: {path} is {what}. A block repo's code and config must be regular files."
        raise BlockRepoError(msg) from None
    except OSError as error:
        msg = f"{where}: {path} cannot be read ({error.strerror})."
        raise BlockRepoError(msg) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            msg = (
                f"{where}: {path} is {kind}, not a regular file; nothing was read. A block repo's code and config "
                f"must be regular files (or links to them)."
            )
            raise BlockRepoError(msg)
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(limit + 1)  # never more than the limit, whatever the size says
    finally:
        os.close(fd)
    if len(data) > limit:
        msg = (
            f"{where}: {path} is larger than the limit of {limit} bytes for a block repo's code or config file; "
            f"nothing was run. Split the file, or keep data out of the block's code."
        )
        raise BlockRepoError(msg)
    return data


def _module_file(folder: str, parts: tuple[str, ...]) -> str | None:
    """The repo file that the module ``parts`` runs from (as ``RepoModules`` picks it), if one is there."""
    path = "/".join(parts)
    for relative in (f"{path}.py", f"{path}/__init__.py"):
        if os.path.lexists(os.path.join(folder, *relative.split("/"))):
            return relative
    return None  # a namespace folder, or missing: ``RepoModules`` says which when it runs


def _relative_targets(source: bytes, relative: str) -> list[tuple[str, ...]]:
    """The modules that the file ``relative`` may import from the repo with ``from .x import y`` statements."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the named module is checked with its message in load.py; a helper fails when run
    parts = tuple(relative[: -len(".py")].split("/"))
    package = parts[:-1]  # a module's package; for ``pkg/__init__.py`` that is ``pkg`` itself
    targets: list[tuple[str, ...]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0 or node.level - 1 > len(package):
            continue  # absolute imports are not the repo's; one above the repo is refused when it runs
        base = package[: len(package) - (node.level - 1)]
        target = base + tuple(node.module.split(".")) if node.module else base
        targets.extend(target[:i] for i in range(1, len(target) + 1))
        targets.extend((*target, alias.name) for alias in node.names if alias.name != "*")
    return targets


def read_code_files(folder: str, code_file: str, where: str) -> dict[str, bytes]:
    """``relative/path.py -> bytes`` of ``code_file`` and every repo file it imports relatively, transitively.

    ``code_file`` must be there (``load.py`` checks it); the ``__init__.py`` of the packages above it are read too.

    Raises:
        BlockRepoError: a file to read is not a regular file of at most :data:`MAX_FILE_BYTES` bytes.
    """
    parts = tuple(code_file[: -len(".py")].split("/"))
    pending = [_module_file(folder, parts[:i]) for i in range(1, len(parts))]
    pending.append(code_file)
    files: dict[str, bytes] = {}
    while pending:
        relative = pending.pop()
        if relative is None or relative in files:
            continue
        files[relative] = read_regular_file(os.path.join(folder, *relative.split("/")), where)
        pending.extend(
            _module_file(folder, target) for target in _relative_targets(files[relative], relative)
        )
    return files
