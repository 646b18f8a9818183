"""Block repos whose code loads block repos: loads nest, one repo's code runs once, a cycle is an error.

A repo's code may call ``ModularPipelineBlocks.from_pretrained`` (in its module or its block's ``__init__``), so
no lock is held across all loads while repo code runs. Each content hash has its own turn instead: a thread
running one repo's code owns that repo until its load ends; another thread that wants the same code waits
for it (and then reuses what it registered). A load that would wait for itself, directly (a repo that loads
itself) or through other threads (A loads B while B, in another thread, loads A), is refused with the chain.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from modular.errors import BlockRepoError

__all__ = ["BlockRepoCycleError", "loading_turn"]


class BlockRepoCycleError(BlockRepoError):
    """A block repo's code loads, directly or through other repos, the repo being loaded."""


_state = threading.Lock()  # guards the three tables below; never held while repo code runs
_owners: dict[str, int] = {}  # content hash -> the thread running that code
_done: dict[str, threading.Event] = {}  # content hash -> set when its owner's load ends
_waiting_for: dict[int, str] = {}  # thread -> the content hash it waits for
_chains = threading.local()  # per thread: the (content hash, where) of the loads it is inside


def _chain() -> list[tuple[str, str]]:
    if not hasattr(_chains, "loads"):
        _chains.loads = []
    loads: list[tuple[str, str]] = _chains.loads
    return loads


def _refuse(chain: list[str], where: str) -> BlockRepoCycleError:
    path = " -> ".join([*chain, where])
    msg = (
        f"{where} is loaded again while its own code is loading it: {path}. A block repo's code must not load "
        f"itself, directly or through the repos it loads; build the block in the code instead."
    )
    return BlockRepoCycleError(msg)


def _waits_on(owner: int, me: int) -> bool:
    """Whether ``owner`` is (through the threads it waits for) waiting for ``me``; ``_state`` is held."""
    seen: set[int] = set()
    while owner not in seen:
        if owner == me:
            return True
        seen.add(owner)
        wanted = _waiting_for.get(owner)
        if wanted is None or wanted not in _owners:
            return False
        owner = _owners[wanted]
    return False


@contextmanager
def loading_turn(content_hash: str, where: str) -> Iterator[None]:
    """This thread's turn to run (or reuse) the code of ``content_hash``; nested turns for other hashes nest.

    Raises:
        BlockRepoCycleError: this thread is already inside a load of ``content_hash``, or waiting would close a
            cycle of threads waiting for each other.
    """
    chain = _chain()
    if any(loading == content_hash for loading, _ in chain):
        raise _refuse([label for _, label in chain], where)
    me = threading.get_ident()
    while True:
        with _state:
            owner = _owners.get(content_hash)
            if owner is None:
                _owners[content_hash] = me
                _done[content_hash] = threading.Event()
                break
            if _waits_on(owner, me):
                raise _refuse([label for _, label in chain], where)
            _waiting_for[me] = content_hash
            done = _done[content_hash]
        done.wait()
        with _state:
            _waiting_for.pop(me, None)
    chain.append((content_hash, where))
    try:
        yield
    finally:
        chain.pop()
        with _state:
            del _owners[content_hash]
            _done.pop(content_hash).set()
