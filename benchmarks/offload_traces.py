"""Replay component-use traces through the real offload engine on a simulated device.

Counts, per trace and strategy: host-to-device bytes, device-to-host bytes, moves (models made
resident), peak resident bytes, decision time, and the ratio of host-to-device bytes to the exact
offline optimum for the trace and budget. For the random mix, whose runs are drawn at random from a
few workflows, it also prints the best an online strategy can expect: the policy that minimises the
expected bytes knowing the workflows and that each run is drawn uniformly from them (the offline
optimum also knows which one comes next, which no online strategy can). Models are modules with one
``meta`` parameter of the component's exact byte size, so nothing is allocated; the engine, ledger
and strategies are the real ones. The peer's own strategy (diffusers' ``AutoOffloadStrategy``) runs
in the same engine with its free-memory query answered from the simulated device; it copies every
victim back to the host (``module.to("cpu")``), so its device-to-host bytes are the bytes it evicts.

Sizes print in GiB (1024**3 bytes), as the components table and the offload log print them.

Run: ``python benchmarks/offload_traces.py`` (CPU only, well under a minute);
``python benchmarks/offload_traces.py --seeds 0-7`` for the random mix over several seeds.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offload_bounds import best_online, optimum  # noqa: E402

import components.quiet_imports  # noqa: E402, F401  (the peer strategy imports diffusers: no torchao noise)
from offload import (  # noqa: E402
    LRUStrategy,
    NextUseStrategy,
    OffloadEngine,
    OffloadRequest,
    OffloadStrategy,
    SimulatedDevice,
    SmallestSufficientSet,
    WatermarkStrategy,
)
from offload.devices.units import GiB  # noqa: E402  (1024**3, printed as GiB everywhere)
from offload.engine.replay import meta_module  # noqa: E402  (modules of exact byte sizes, nothing allocated)

HUB_GB = 10**9  # the Hub lists file sizes in decimal GB
Use = str | tuple[str, int]  # a component, or (component, loop steps)


# -- models and workflows --------------------------------------------------------------------
class Workflow:
    """A pipeline's component uses in order; ``(name, steps)`` is a loop body run ``steps`` times."""

    def __init__(self, name: str, uses: Sequence[Use]):
        self.name = name
        self.uses = list(uses)

    @property
    def plan(self) -> list[str]:
        """What the pipeline tells the engine: uses in order, loop bodies once."""
        return [u if isinstance(u, str) else u[0] for u in self.uses]

    def unrolled(self) -> list[str]:
        """Every use, loops unrolled."""
        out: list[str] = []
        for use in self.uses:
            out += [use] if isinstance(use, str) else [use[0]] * use[1]
        return out


class Trace:
    """Workflow runs over one set of component sizes, at one budget and margin.

    ``mix``: for a random trace, the workflows its runs are drawn from, uniformly and independently.
    """

    def __init__(
        self,
        name: str,
        sizes: dict[str, int],
        runs: list[Workflow],
        budget: int,
        margin: int,
        mix: Sequence[Workflow] = (),
    ):
        self.name, self.sizes, self.runs, self.budget, self.margin = name, sizes, runs, budget, margin
        self.mix = list(mix)

    def requests(self) -> list[str]:
        return [model for run in self.runs for model in run.unrolled()]


# -- the peer's strategy inside our engine ---------------------------------------------------
class PeerAutoOffload(OffloadStrategy):
    """diffusers' AutoOffloadStrategy, called as the peer's hook calls it, memory query patched."""

    copies_back = True

    def __init__(self, device: SimulatedDevice, margin: int, sizes: dict[str, int]):
        from diffusers.modular_pipelines import components_manager as peer

        self._peer_module = peer
        self._peer = peer.AutoOffloadStrategy(memory_reserve_margin=margin)
        self._device = device
        self._sizes = sizes

    @property
    def name(self) -> str:
        return "peer AutoOffloadStrategy"

    def select_victims(self, request: OffloadRequest) -> list[str]:
        device, sizes = self._device, self._sizes

        class _Model:
            def __init__(self, model_id):
                self.model_id = model_id

            def get_memory_footprint(self):
                return sizes[self.model_id]

        class _Hook:
            def __init__(self, model_id):
                self.model_id = model_id
                self.model = _Model(model_id)

        class _Backend:
            def __init__(self, *_):
                pass

            def mem_get_info(self):
                return device.free_bytes(), device.budget

        hooks = [_Hook(m) for m in request.residents]
        with mock.patch.object(self._peer_module, "TorchDeviceBackend", _Backend):
            chosen = self._peer(
                hooks=hooks,
                model_id=request.model_id,
                model=_Model(request.model_id),
                execution_device="cuda",
            )
        return [hook.model_id for hook in chosen]


# -- replay ----------------------------------------------------------------------------------
STRATEGIES = (
    "NextUse (ours)",
    "LRU",
    "SmallestSufficientSet",
    "peer AutoOffloadStrategy",
    "Watermark 0.5-0.9",
)


def make_strategy(name: str, device: SimulatedDevice, trace: Trace) -> OffloadStrategy:
    if name == "NextUse (ours)":
        return NextUseStrategy()
    if name == "LRU":
        return LRUStrategy()
    if name == "SmallestSufficientSet":
        return SmallestSufficientSet()
    if name == "Watermark 0.5-0.9":  # a UI's memory manager: headroom kept, paid for in bytes moved
        return WatermarkStrategy(low=0.5, high=0.9)
    return PeerAutoOffload(device, trace.margin, trace.sizes)


def replay(trace: Trace, strategy_name: str) -> dict:
    device = SimulatedDevice(trace.budget)
    engine = OffloadEngine(device, memory_reserve_margin=trace.margin)
    engine.set_strategy(make_strategy(strategy_name, device, trace))
    for model_id, nbytes in trace.sizes.items():
        engine.attach(model_id, meta_module(nbytes))
    times = []
    for run in trace.runs:
        engine.set_plan(run.plan)
        for model_id in run.unrolled():
            if engine.is_resident(model_id):
                engine.ensure_resident(model_id)
                continue
            start = time.perf_counter()
            engine.ensure_resident(model_id)
            times.append(time.perf_counter() - start)
            assert device.used_bytes() <= trace.budget - trace.margin, "budget violated"
    log = engine.log
    evicted = sum(trace.sizes[m] for d in log for m in d.evicted)
    copies_back = getattr(engine.strategy, "copies_back", False)
    return {
        "h2d": log.total_bytes_to_device,
        "d2h": evicted if copies_back else log.total_bytes_to_host,
        "moves": sum(1 for d in log if d.bytes_to_device),
        "peak": engine.peak_resident_bytes,
        "decision_ms": 1000 * max(times) if times else 0.0,
    }


# -- traces ----------------------------------------------------------------------------------
def flux_traces() -> list[Trace]:
    sizes = {
        "clip": int(0.23 * GiB),
        "t5": int(8.87 * GiB),
        "transformer": int(22.17 * GiB),
        "canny": int(22.17 * GiB),
        "depth": int(22.17 * GiB),
        "vae": int(0.16 * GiB),
    }
    t2i = Workflow("flux text2img", ["clip", "t5", ("transformer", 28), "vae"])
    canny = Workflow("flux canny", ["clip", "t5", "vae", ("canny", 50), "vae"])
    depth = Workflow("flux depth", ["clip", "t5", "vae", ("depth", 30), "vae"])
    runs = [t2i, canny, depth] * 2
    return [Trace(f"flux 3 workflows x2 @ {b} GiB", sizes, runs, b * GiB, 3 * GiB) for b in (40, 32)]


SDXL_SIZES = {  # fp16 file sizes as the Hub lists them
    "text_encoder": int(0.246 * HUB_GB),
    "text_encoder_2": int(1.39 * HUB_GB),
    "unet": int(5.14 * HUB_GB),
    "refiner_unet": int(4.52 * HUB_GB),
    "vae": int(0.167 * HUB_GB),
}
SDXL_BASE = Workflow("sdxl base", ["text_encoder", "text_encoder_2", ("unet", 30), "vae"])
SDXL_REFINER = Workflow("sdxl refiner", ["text_encoder_2", "vae", ("refiner_unet", 20), "vae"])


def sdxl_traces() -> list[Trace]:
    # Budgets and margin in the Hub's decimal GB, like the sizes; names print them in GiB.
    alternating = [SDXL_BASE, SDXL_REFINER] * 4
    out = []
    for b in (9, 7.5):
        budget = int(b * HUB_GB)
        name = f"sdxl base+refiner x4 @ {budget / GiB:.2f} GiB"
        out.append(Trace(name, SDXL_SIZES, alternating, budget, HUB_GB))
    base_only = {k: v for k, v in SDXL_SIZES.items() if k != "refiner_unet"}
    for b in (9, 7.5, 7, 6.5):
        budget = int(b * HUB_GB)
        out.append(
            Trace(f"sdxl text2img x5 @ {budget / GiB:.2f} GiB", base_only, [SDXL_BASE] * 5, budget, HUB_GB)
        )
    return out


def random_mix_trace(seed: int = 0) -> Trace:
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(8)]
    sizes = {n: int(rng.uniform(0.2, 12.0) * GiB) for n in names}
    workflows = []
    for w in range(5):
        members = rng.sample(names, rng.randint(3, 5))
        loop = max(members, key=sizes.get)
        uses: list[Use] = [(m, 20) if m == loop else m for m in members]
        workflows.append(Workflow(f"w{w}", uses))
    runs = [rng.choice(workflows) for _ in range(30)]
    budget = max(int(0.5 * sum(sizes.values())), max(sizes.values())) + 2 * GiB
    name = f"random 5 workflows / 8 comps (seed {seed}) @ {budget / GiB:.1f} GiB"
    return Trace(name, sizes, runs, budget, 2 * GiB, mix=workflows)


# -- decision time with 20 components --------------------------------------------------------
def decision_time(strategy: OffloadStrategy, components: int = 20, rounds: int = 200) -> float:
    """Mean milliseconds of one ensure_resident that must evict, with ``components`` models resident."""
    sizes = {f"m{i}": (i + 1) * GiB // 10 for i in range(components + 1)}
    budget = sum(sizes.values()) - sizes["m0"]
    engine = OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=0, strategy=strategy)
    for model_id, nbytes in sizes.items():
        engine.attach(model_id, meta_module(nbytes))
    engine.set_plan(list(sizes))
    order = list(sizes)
    for model_id in order[1:]:
        engine.ensure_resident(model_id)
    total, count = 0.0, 0
    for k in range(rounds):
        wanted = next(m for m in order[k % len(order) :] + order if not engine.is_resident(m))
        start = time.perf_counter()
        engine.ensure_resident(wanted)
        total += time.perf_counter() - start
        count += 1
    return 1000 * total / count


def seeds_table(seeds: range) -> None:
    """Host-to-device bytes over the offline optimum on the random mix, one row per seed, and ours over the
    best online policy (the reference an online strategy is held to)."""
    columns = ("NextUse (ours)", "peer AutoOffloadStrategy")
    print(f"{'seed':>4} {'optimum GiB':>11} {'ours':>6} {'peer':>6} {'best online':>11} {'ours/online':>11}")
    ratios: dict[str, list[float]] = {"ours": [], "peer": [], "online": [], "ours/online": []}
    for seed in seeds:
        trace = random_mix_trace(seed)
        best = optimum(trace)
        row = [replay(trace, name)["h2d"] / best for name in columns] + [best_online(trace) / best]
        row.append(row[0] / row[2])
        for key, ratio in zip(ratios, row, strict=True):
            ratios[key].append(ratio)
        print(f"{seed:>4} {best / GiB:11.2f} {row[0]:6.3f} {row[1]:6.3f} {row[2]:11.3f} {row[3]:11.3f}")
    for key, values in ratios.items():
        print(f"{key}: {min(values):.3f}-{max(values):.3f}, mean {sum(values) / len(values):.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", help="only the random mix over these seeds, e.g. 0-7")
    args = parser.parse_args(argv)
    if args.seeds:
        first, _, last = args.seeds.partition("-")
        seeds_table(range(int(first), int(last or first) + 1))
        return 0
    traces = flux_traces() + sdxl_traces() + [random_mix_trace()]
    header = f"{'trace':<48} {'strategy':<26} {'h2d GiB':>8} {'d2h GiB':>8} {'moves':>5} {'peak GiB':>8} {'max ms':>7} {'x opt':>6}"
    print(header)
    print("-" * len(header))
    failures = []
    for trace in traces:
        best = optimum(trace)
        results = {name: replay(trace, name) for name in STRATEGIES}
        for name, r in results.items():
            ratio = r["h2d"] / best
            print(
                f"{trace.name:<48} {name:<26} {r['h2d'] / GiB:8.2f} {r['d2h'] / GiB:8.2f} {r['moves']:5d} "
                f"{r['peak'] / GiB:8.2f} {r['decision_ms']:7.3f} {ratio:6.3f}"
            )
        print(f"{'':<48} {'offline optimum':<26} {best / GiB:8.2f}")
        online = best_online(trace) if trace.mix else None
        if online is not None:
            print(
                f"{'':<48} {'best online (knows mix)':<26} {online / GiB:8.2f} {'':>31} {online / best:6.3f}"
            )
        ours, peer = results["NextUse (ours)"], results["peer AutoOffloadStrategy"]
        if ours["d2h"]:
            failures.append(f"{trace.name}: device-to-host {ours['d2h']} bytes")
        # A trace whose next call is drawn at random is held to the best online policy: the offline
        # optimum knows which workflow comes next, which no online strategy can (best online is itself
        # 1.03-1.15x the optimum on seeds 0-7; `--seeds 0-7` prints ours beside it).
        reference, against = (online, "best online") if online is not None else (best, "the optimum")
        if ours["h2d"] > 1.05 * reference:
            failures.append(f"{trace.name}: {ours['h2d'] / reference:.3f}x {against}")
        if ours["h2d"] > peer["h2d"]:
            failures.append(f"{trace.name}: more host-to-device bytes than the peer")
    print()
    from offload_streaming import partial_table  # imports this module: imported here, not at the top

    failures += partial_table()  # partial residency: streamed groups and shrunk victims, against the bound
    print()
    ours_ms = decision_time(NextUseStrategy())
    print(f"decision time, 20 resident components, NextUse (ours): {ours_ms:.3f} ms per eviction decision")
    for n in (12, 16):
        ms = decision_time(SmallestSufficientSet(), components=n, rounds=5)
        print(f"decision time, {n} resident components, SmallestSufficientSet (2^n search): {ms:.1f} ms")
    if ours_ms >= 1.0:
        failures.append(f"decision time {ours_ms:.3f} ms >= 1 ms")
    print()
    print("targets: " + ("all met" if not failures else "MISSED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
