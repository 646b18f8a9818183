"""The processes of a batch run: torch.distributed when launched by ``torchrun`` or ``accelerate launch``.

A launcher sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in each
process; ``RankGroup`` joins them through torch.distributed's own ``env://`` rendezvous with the gloo
backend (ranks exchange only a list of entries, counters and the manifest's records; images never
travel, so gloo serves GPU machines as well). Finished entries are counted on the rendezvous store
(``store.add``: one small request per entry, no collective), so no rank waits for another while it works
and rank 0 can show one bar for the whole job. Without a launcher the group is this process alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import attrs
import torch
import torch.distributed as dist

__all__ = ["RankGroup", "RankInfo", "split_entries"]

T = TypeVar("T")
_FAILED = "failed"
_DONE = "done"


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "")
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        msg = f"environment variable {name} must be a whole number (got {text!r}); it is set by torchrun"
        raise ValueError(msg) from None


@attrs.frozen
class RankInfo:
    """Where this process stands: its rank among ``world_size`` processes, and its rank on this machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankInfo:
        """From ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (0, 1 and 0 when not set).

        Raises:
            ValueError: a value that is not a whole number, or a rank outside ``0..WORLD_SIZE-1``.
        """
        env = os.environ if environ is None else environ
        info = cls(_env_int(env, "RANK", 0), _env_int(env, "WORLD_SIZE", 1), _env_int(env, "LOCAL_RANK", 0))
        if info.world_size < 1 or not 0 <= info.rank < info.world_size or info.local_rank < 0:
            msg = f"RANK ({info.rank}) must be in 0..WORLD_SIZE-1 (WORLD_SIZE is {info.world_size}); launch with torchrun"
            raise ValueError(msg)
        return info

    @property
    def device(self) -> torch.device:
        """This rank's device: ``cuda:LOCAL_RANK`` when CUDA is present, else the CPU.

        Raises:
            ValueError: ``LOCAL_RANK`` names a GPU this machine does not have.
        """
        if not torch.cuda.is_available():
            return torch.device("cpu")
        count = torch.cuda.device_count()
        if self.local_rank >= count:
            msg = (
                f"LOCAL_RANK ({self.local_rank}) names a GPU this machine does not have (it has {count}); "
                f"start at most {count} processes per machine (--nproc-per-node {count})"
            )
            raise ValueError(msg)
        return torch.device("cuda", self.local_rank)


def split_entries(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Rank ``rank``'s share: every ``world_size``-th item from position ``rank`` (a strided split, so
    entries of every workflow and size spread evenly over the ranks)."""
    return list(items[rank::world_size])


class RankGroup:
    """The ranks of one run, as a context manager: joins torch.distributed on enter, leaves it on exit.

    Args:
        info: This process's rank.
        timeout: How long rendezvous and collectives wait for the other ranks.
    """

    def __init__(self, info: RankInfo, timeout: timedelta = timedelta(minutes=30)) -> None:
        self.info = info
        self.timeout = timeout
        self._store: Any = None  # torch.distributed's rendezvous store, with this run's key prefix
        self._own_group = False
        self._done = 0

    @property
    def distributed(self) -> bool:
        return self.info.world_size > 1

    def __enter__(self) -> RankGroup:
        if not self.distributed:
            return self
        if dist.is_initialized():
            msg = "a batch run sets up torch.distributed itself; run it in processes that have not called init_process_group"
            raise RuntimeError(msg)
        store, rank, world_size = next(
            dist.rendezvous(
                "env://", rank=self.info.rank, world_size=self.info.world_size, timeout=self.timeout
            )
        )
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=self.timeout)
        self._own_group = True
        self._store = store
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._own_group:
            dist.destroy_process_group()
            self._own_group = False

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value``, on every rank."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's ``value``, in rank order, on rank 0 (``None`` on the others)."""
        if not self.distributed:
            return [value]
        gathered: list[Any] | None = [None] * self.info.world_size if self.info.rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def start_counting(self, run_id: str) -> None:
        """Count this run's entries under its own keys (a launcher's store outlives one run)."""
        if self.distributed:
            self._store = dist.PrefixStore(f"modular-batch/{run_id}/", self._store)

    def count(self, entries: int = 1) -> int:
        """Add finished entries; returns the count over all ranks."""
        if not self.distributed:
            self._done += entries
            return self._done
        return int(self._store.add(_DONE, entries))

    def fail(self, reason: str) -> None:
        """Tell the other ranks this rank failed (they stop waiting for its entries)."""
        if self.distributed:
            self._store.set(_FAILED, f"rank {self.info.rank}: {reason}")

    def wait_for(self, total: int, progress: Callable[[int], Any] | None = None, poll: float = 0.2) -> None:
        """Wait until ``total`` entries are counted over all ranks, calling ``progress(count)`` meanwhile.

        Raises:
            RuntimeError: another rank failed.
        """
        while True:
            done = self.count(0)
            if progress is not None:
                progress(done)
            if done >= total or not self.distributed:
                return
            if self._store.check([_FAILED]):
                msg = f"stopped: {self._store.get(_FAILED).decode()}"
                raise RuntimeError(msg)
            time.sleep(poll)
