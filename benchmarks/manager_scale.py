"""The manager's operations as it grows: 100, 1,000 and 10,000 attached models, beside the peer.

Each size registers that many tiny models (a bias-free ``nn.Linear(8, 8)``, 256 bytes) in our
``ComponentsManager`` and in diffusers' ``modular_pipelines.ComponentsManager``, then times, per call:
``add``, ``get_one(component_id=)``, ``get_one(name=)``, ``search_components`` (a prefix pattern), the
printed table (``str(cm)``), ``enable_auto_cpu_offload``, a hooked call of a resident model, a hooked
call that needs an eviction (ours: the device holds four models and five take turns), and
``disable_auto_cpu_offload``. Our offload runs on a ``SimulatedDevice`` (the decisions and bookkeeping of a
real device, no copies); the peer's is enabled on ``"cpu"`` with its free-memory query answered, as in
``tests/test_benchmarks.py``. The peer's hooked calls are left out: on the CPU its hook compares the model's
``cpu`` with its execution device ``cpu:0`` and moves the model at every call, resident or not.

Printed per row: the median time, ours / the peer's, and ours at N / ours at the smallest size. The targets
(issue 21): a hooked call at 10,000 models within 1.5x of the same at 100; enable and disable linear (10x
the models, at most 12x the time); ``get_one(component_id=)`` within 2x of the peer's.

    python benchmarks/manager_scale.py                       # 100, 1,000 and 10,000 models
    python benchmarks/manager_scale.py --sizes 100,1000      # the larger size takes minutes on 2 cores
    python benchmarks/manager_scale.py --quick               # 20 and 200 models, few repeats (the test's run)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import attrs
import torch

from components import ComponentsManager
from offload import SimulatedDevice

WIDTH = 8  # each model is an 8 x 8 float32 weight: 256 bytes
MODEL_BYTES = WIDTH * WIDTH * 4
RESIDENT = 4  # the eviction row's device holds this many models; RESIDENT + 1 take turns
OPERATIONS = (
    "add",
    "get_one(component_id=)",
    "get_one(name=)",
    "search_components",
    "table (str)",
    "enable_auto_cpu_offload",
    "hooked call (resident)",
    "hooked call (evicts one)",
    "disable_auto_cpu_offload",
)
#: Rows where the time of the whole operation is shown (it grows with the models by nature); the others are per call.
WHOLE = {"table (str)", "enable_auto_cpu_offload", "disable_auto_cpu_offload"}


@attrs.define
class Row:
    """One operation at one size: median seconds of ours and of the peer's (None: the peer lacks it)."""

    operation: str
    size: int
    ours: float
    peer: float | None


class Tiny(torch.nn.Linear):
    """A bias-free Linear with the one ``ModelMixin`` method the peer's table calls."""

    def get_memory_footprint(self) -> int:
        return MODEL_BYTES


def models(count: int) -> list[Tiny]:
    """``count`` tiny models, made without random init (their values do not matter)."""
    with torch.device("meta"):
        shells = [Tiny(WIDTH, WIDTH, bias=False) for _ in range(count)]
    for shell in shells:
        shell.to_empty(device="cpu")
        torch.nn.init.ones_(shell.weight)
    return shells


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The garbage collector off while timing, as ``timeit`` does: its passes over every live object would
    charge the growing heap to whichever call they happen to interrupt."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def per_call(function: Callable[[int], Any], calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the seconds per call of ``function(i)``, ``calls`` calls a round."""
    times = []
    for _ in range(rounds):
        with no_gc():
            start = time.perf_counter()
            for i in range(calls):
                function(i)
            times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def once(function: Callable[[], Any]) -> float:
    """Seconds of one call of ``function()``."""
    with no_gc():
        start = time.perf_counter()
        function()
        return time.perf_counter() - start


@contextlib.contextmanager
def peer_on_cpu() -> Iterator[None]:
    """The peer's offload on the CPU: its free-memory query answered with plenty (it asks CUDA otherwise)."""
    from diffusers.utils.torch_utils import TorchDeviceBackend

    with mock.patch.object(TorchDeviceBackend, "mem_get_info", lambda self: (10**12, 10**12)):
        yield


def measure_registry(cm: Any, shells: list[torch.nn.Module], calls: int, rounds: int) -> dict[str, float]:
    """Medians of what both managers have with one call shape: add every model, look up, search, print."""
    count = len(shells)
    out: dict[str, float] = {}
    out["add"] = once(lambda: [cm.add(f"m{i}", shell) for i, shell in enumerate(shells)]) / count
    ids = [f"m{i}_{id(shell)}" for i, shell in enumerate(shells)]
    out["get_one(component_id=)"] = per_call(lambda i: cm.get_one(component_id=ids[i % count]), calls, rounds)
    out["get_one(name=)"] = per_call(
        lambda i: cm.get_one(name=f"m{(i * 7919) % count}"), max(calls // 50, 3), rounds
    )
    out["search_components"] = per_call(lambda i: cm.search_components("m1*"), max(calls // 50, 3), rounds)
    out["table (str)"] = statistics.median(once(lambda: str(cm)) for _ in range(max(rounds // 2, 1)))
    return out


def measure_ours(count: int, calls: int, rounds: int) -> dict[str, float]:
    """Our manager's medians at ``count`` models; checks that hooked calls compute what unhooked ones do."""
    shells = models(count)
    x = torch.ones(1, WIDTH)
    expected = shells[0](x)
    cm = ComponentsManager()
    out = measure_registry(cm, shells, calls, rounds)
    device = SimulatedDevice(MODEL_BYTES * RESIDENT, name="scale")
    enables, disables = [], []
    for _ in range(max(rounds // 2, 1)):
        enables.append(once(lambda: cm.enable_auto_cpu_offload(device, memory_reserve_margin=0)))
        disables.append(once(cm.disable_auto_cpu_offload))
    out["enable_auto_cpu_offload"] = statistics.median(enables)
    out["disable_auto_cpu_offload"] = statistics.median(disables)
    cm.enable_auto_cpu_offload(device, memory_reserve_margin=0)
    first = shells[0]
    if not torch.equal(first(x), expected):
        raise AssertionError("a hooked call computed something else than the unhooked call")
    out["hooked call (resident)"] = per_call(lambda i: first(x), calls, rounds)
    turns = shells[: RESIDENT + 1]
    for turn in turns:  # the device full before the timed calls
        turn(x)
    log = cm.offload_log
    assert log is not None
    before = len(log)
    out["hooked call (evicts one)"] = per_call(lambda i: turns[i % len(turns)](x), calls, rounds)
    evictions = sum(1 for decision in list(log)[before:] if decision.evicted)
    if evictions < calls * rounds // 2:
        raise AssertionError(f"the eviction row evicted {evictions} times in {calls * rounds} calls")
    cm.disable_auto_cpu_offload()
    out["unhooked call"] = per_call(lambda i: first(x), calls, rounds)
    return out


def measure_peer(count: int, calls: int, rounds: int) -> dict[str, float]:
    """The peer manager's medians at ``count`` models, for the operations it has."""
    from diffusers.modular_pipelines import ComponentsManager as PeerManager

    shells = models(count)
    cm = PeerManager()
    out = measure_registry(cm, shells, calls, rounds)
    with peer_on_cpu():
        enables, disables = [], []
        for _ in range(max(rounds // 2, 1)):
            enables.append(once(lambda: cm.enable_auto_cpu_offload("cpu", memory_reserve_margin=0)))
            disables.append(once(cm.disable_auto_cpu_offload))
        out["enable_auto_cpu_offload"] = statistics.median(enables)
        out["disable_auto_cpu_offload"] = statistics.median(disables)
    return out


def run(sizes: list[int], calls: int, rounds: int, peer: bool) -> tuple[list[Row], dict[int, float]]:
    """Every row at every size, and the unhooked call's median at each size."""
    rows: list[Row] = []
    unhooked: dict[int, float] = {}
    measure_ours(5, 5, 1)  # warm-up: the first table, enable and call import and cache what they use
    if peer:
        measure_peer(5, 5, 1)
    for size in sizes:
        ours = measure_ours(size, calls, rounds)
        gc.collect()  # between the sides: each starts on a collected heap
        theirs = measure_peer(size, calls, rounds) if peer else {}
        gc.collect()
        unhooked[size] = ours.pop("unhooked call")
        rows.extend(Row(op, size, ours[op], theirs.get(op)) for op in OPERATIONS)
    return rows, unhooked


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:8.2f} s "
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds * 1e6:8.2f} us"


def table(rows: list[Row], unhooked: dict[int, float]) -> str:
    """The rows as text: time, ours / peer, and ours at N / ours at the smallest size."""
    smallest = min(row.size for row in rows)
    base = {row.operation: row.ours for row in rows if row.size == smallest}
    header = f"{'operation':<32} {'models':>7} {'ours':>11} {'peer':>11} {'ours/peer':>10} {'vs ' + str(smallest):>8}"
    lines = [header]
    for row in rows:
        peer = _time(row.peer) if row.peer is not None else f"{'-':>11}"
        ratio = f"{row.ours / row.peer:9.2f}x" if row.peer else f"{'-':>10}"
        name = row.operation + (" (all)" if row.operation in WHOLE else "")
        lines.append(
            f"{name:<32} {row.size:>7} {_time(row.ours)} {peer} {ratio} {row.ours / base[row.operation]:7.2f}x"
        )
    lines.append("unhooked call: " + ", ".join(f"{_time(t).strip()} at {n}" for n, t in unhooked.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="model counts, comma separated")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed round of a per-call row")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians are taken over them)")
    parser.add_argument("--quick", action="store_true", help="20 and 200 models, 50 calls, 3 rounds")
    parser.add_argument("--no-peer", action="store_true", help="ours only")
    args = parser.parse_args(argv)
    sizes = [20, 200] if args.quick else [int(size) for size in args.sizes.split(",")]
    calls, rounds = (50, 3) if args.quick else (args.calls, args.rounds)
    torch.set_num_threads(1)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the peer warns on each add; not part of the measurement
    try:
        rows, unhooked = run(sizes, calls, rounds, peer=not args.no_peer)
    finally:
        logging.disable(previous)
    print(
        f"manager scale: sizes {sizes}, {calls} calls x {rounds} rounds per row, {torch.get_num_threads()} thread"
    )
    print(table(rows, unhooked))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
