"""Partial residency and prefetch on the seed's traces, through the real engine on a simulated device.

1. Host-to-device bytes with models split into blocks (so a model may stay partly resident and stream
   the rest, and a victim may keep a resident prefix: ``engine.shrink_victims``) on the seed's Flux
   traces at 40 and 32 GiB, against whole-model offload (ours), the whole-model offline optimum, and a
   prefix-residency lower bound (``prefix_bound``: the fewest bytes any placement that keeps bytes, not
   whole models, can move). Targets: within 1.10x of the bound; at 32 GiB, 10 % fewer than whole models.
2. Simulated wall time of the same traces at 25 GB/s host-to-device, with and without prefetch, next to
   the peer's rule (diffusers' AutoOffloadStrategy in our engine, plus its copies back, which block) and
   diffusers' ``enable_model_cpu_offload`` (each model moved in when used and back when another runs);
   and at 16 GiB, below one transformer, where the denoisers stream and only ours can run.

Models are modules of meta tensors of the exact sizes, in blocks (nothing is allocated); forwards run
through the hooks, so streamed groups are counted as they would be. Assumed compute times per call
(parameters, not measurements; change them with the constants below): Flux transformer step 0.45 s
(the order of a 1024x1024 Flux-dev step on an H100 in bf16), T5 0.05 s, CLIP 0.01 s, VAE 0.15 s.
Steps: the seed's 28 (text2img), 50 (canny), 30 (depth). Block counts: Flux transformer 57 (19 double +
38 single blocks), T5 24, CLIP 12, VAE 1 (no top-level block list: leaves would do; one group here).

Run: ``python benchmarks/offload_streaming.py`` (CPU only, well under a minute).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offload_bounds import optimum  # noqa: E402
from offload_traces import PeerAutoOffload, Trace, flux_traces  # noqa: E402

from offload import OffloadEngine, SimulatedDevice  # noqa: E402
from offload.devices.units import GiB  # noqa: E402

BANDWIDTH = "25GB/s"
BLOCKS = {"clip": 12, "t5": 24, "transformer": 57, "canny": 57, "depth": 57, "vae": 1}
COMPUTE = {"clip": 0.01, "t5": 0.05, "transformer": 0.45, "canny": 0.45, "depth": 0.45, "vae": 0.15}


class MetaBlocks(torch.nn.Module):
    """``blocks`` modules of meta weights adding up to ``nbytes``; its forward calls each block."""

    def __init__(self, nbytes: int, blocks: int):
        super().__init__()
        sizes = [nbytes // blocks] * blocks
        sizes[0] += nbytes - sum(sizes)
        self.blocks = torch.nn.ModuleList(_meta_leaf(size) for size in sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class _MetaLeaf(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _meta_leaf(nbytes: int) -> torch.nn.Module:
    leaf = _MetaLeaf()
    leaf.weight = torch.nn.Parameter(
        torch.empty(nbytes, dtype=torch.uint8, device="meta"), requires_grad=False
    )
    return leaf


def run(
    trace: Trace, split: bool, prefetch: bool = False, strategy: object = None, clock: bool = False
) -> dict:
    """Replay ``trace``; returns host-to-device bytes, device-to-host bytes, evicted bytes and wall time."""
    bandwidth = BANDWIDTH if clock else None
    device = SimulatedDevice(trace.budget, h2d_bandwidth=bandwidth, compute_time=COMPUTE if clock else None)
    engine = OffloadEngine(device, memory_reserve_margin=trace.margin)
    if strategy is not None:
        engine.set_strategy(PeerAutoOffload(device, trace.margin, trace.sizes))
    engine.prefetch = prefetch
    engine.shrink_victims = split  # victims keep a resident prefix when that moves fewer bytes
    models = {m: MetaBlocks(n, BLOCKS[m] if split else 1) for m, n in trace.sizes.items()}
    for model_id, model in models.items():
        engine.attach(model_id, model)
    x = torch.empty(1)
    for workflow in trace.runs:
        engine.set_plan(workflow.plan)
        for model_id in workflow.unrolled():
            models[model_id](x)
            assert device.used_bytes() <= trace.budget - trace.margin, "budget violated"
    log = engine.log
    return {
        "h2d": log.total_bytes_to_device,
        "d2h": log.total_bytes_to_host,
        "evicted": sum(trace.sizes[m] for d in log for m in d.evicted),
        "wall": engine.simulated_clock.now if engine.simulated_clock else 0.0,
        "streamed": any(d.reason == "stream" for d in log),
    }


def prefix_bound(trace: Trace) -> int:
    """A lower bound on host-to-device bytes for any placement, partial residency allowed.

    Relax the engine's problem to single bytes: each use of a model needs each of its bytes on the device
    at some moment of the use, and at most ``budget - margin`` bytes are there at once. Every placement
    the engine can make (whole models, resident prefixes, streamed groups, shrunk victims) obeys this, so
    the fewest bytes this relaxation moves bound it from below. With bytes as equal-size pages, the fewest
    bytes are what Belady's rule moves: on a miss, drop the byte needed furthest ahead (Belady 1966;
    optimal for equal pages). All bytes of one model share their future, so the rule runs per model and
    per byte count: a use of ``m`` moves in its missing bytes; room comes from what is free, then from
    the models needed after ``m``'s next use, furthest first; past that, ``m``'s own bytes make room for
    its later ones (it streams). Loops are unrolled, so a denoiser streamed every step pays every step.
    """
    room = trace.budget - trace.margin
    requests = trace.requests()
    never = len(requests)
    following = [never] * len(requests)  # position of each request's model's next request
    seen: dict[str, int] = {}
    for position in range(len(requests) - 1, -1, -1):
        following[position] = seen.get(requests[position], never)
        seen[requests[position]] = position
    resident: dict[str, int] = {}  # model -> its bytes on the device
    next_use: dict[str, int] = {}
    total = 0
    for position, model in enumerate(requests):
        own_next, have = following[position], resident.get(model, 0)
        missing = trace.sizes[model] - have
        total += missing
        short = missing - (room - sum(resident.values()))
        others = sorted(((next_use[m], m) for m in resident if m != model and resident[m]), reverse=True)
        for when, other in others:
            if short <= 0:
                break
            if when < own_next and have + missing - short > 0:
                break  # every other is needed sooner: this model's own earlier bytes make room (it streams)
            dropped = min(resident[other], short if when >= own_next else 1)
            resident[other] -= dropped
            short -= dropped
        resident[model] = trace.sizes[model] - max(short, 0)
        next_use[model] = own_next
    return total


def model_cpu_offload_wall(trace: Trace, bandwidth: float) -> float:
    """diffusers' ``enable_model_cpu_offload``: a model moves in when used and back out when the next runs;
    every copy blocks the compute (synchronous ``.to()``)."""
    wall, previous = 0.0, None
    for workflow in trace.runs:
        for model_id in workflow.unrolled():
            if model_id != previous:
                moved = trace.sizes[model_id] + (trace.sizes[previous] if previous else 0)
                wall += moved / bandwidth
            wall += COMPUTE[model_id]
            previous = model_id
    return wall


def partial_table() -> list[str]:
    """Print host-to-device bytes with partial residency (streaming, shrunk victims) on the seed's Flux
    traces against whole-model offload, its offline optimum and ``prefix_bound``; returns missed targets."""
    failures = []
    print("host-to-device GiB (partial = models in blocks, victims may shrink; bound = prefix_bound)")
    print(
        f"{'trace':<34} {'whole':>8} {'partial':>8} {'saved':>6} {'optimum':>8} {'bound':>8} "
        f"{'partial/bound':>13} {'d2h':>5}"
    )
    for trace in flux_traces():
        whole, partial = run(trace, split=False), run(trace, split=True)
        best, bound = optimum(trace), prefix_bound(trace)
        saved = 1 - partial["h2d"] / whole["h2d"]
        print(
            f"{trace.name:<34} {whole['h2d'] / GiB:8.2f} {partial['h2d'] / GiB:8.2f} {saved:6.1%} {best / GiB:8.2f} "
            f"{bound / GiB:8.2f} {partial['h2d'] / bound:13.3f} {partial['d2h']:5d}"
        )
        if partial["d2h"]:
            failures.append(f"{trace.name}: device-to-host bytes")
        if partial["h2d"] > whole["h2d"]:
            failures.append(f"{trace.name}: partial residency moved more than whole-model offload")
        if partial["h2d"] > 1.10 * bound:
            failures.append(f"{trace.name}: {partial['h2d'] / bound:.3f}x the prefix bound (target 1.10x)")
        if trace.budget <= 32 * GiB and saved < 0.10:
            failures.append(f"{trace.name}: {saved:.1%} fewer bytes than whole-model offload (target 10 %)")
    return failures


def main() -> int:
    bandwidth = SimulatedDevice(1, h2d_bandwidth=BANDWIDTH).h2d_bandwidth or 1
    failures = partial_table()
    print()
    print(f"simulated wall time, s, at {BANDWIDTH} (compute per call: {COMPUTE})")
    print(f"{'trace':<34} {'ours':>8} {'+prefetch':>9} {'peer rule':>9} {'model_cpu_offload':>17}")
    for trace in flux_traces():
        ours = run(trace, split=True, clock=True)
        ahead = run(trace, split=True, prefetch=True, clock=True)
        peer = run(trace, split=False, strategy="peer", clock=True)
        peer_wall = peer["wall"] + peer["evicted"] / bandwidth  # its copies back block the compute
        model_wall = model_cpu_offload_wall(trace, bandwidth)
        print(
            f"{trace.name:<34} {ours['wall']:8.2f} {ahead['wall']:9.2f} {peer_wall:9.2f} {model_wall:17.2f}"
        )
        if ahead["wall"] > ours["wall"]:
            failures.append(f"{trace.name}: prefetch made it slower")
    # Below one transformer (22.17 GiB) the denoisers stream their tails at every step: there prefetch
    # overlaps each streamed block's copy with the block before it. The peer's rule and
    # enable_model_cpu_offload move whole models and cannot run this budget at all.
    base = flux_traces()[0]
    streamed = Trace("flux 3 workflows x2 @ 16 GiB", base.sizes, base.runs, 16 * GiB, base.margin)
    ours = run(streamed, split=True, clock=True)
    ahead = run(streamed, split=True, prefetch=True, clock=True)
    gained = 1 - ahead["wall"] / ours["wall"]
    print(
        f"{streamed.name:<34} {ours['wall']:8.2f} {ahead['wall']:9.2f} {'n/a':>9} {'n/a':>17}"
        f"   (prefetch hides {gained:.1%} of the wall time)"
    )
    if ahead["wall"] >= ours["wall"]:
        failures.append(f"{streamed.name}: prefetch gained nothing while streaming")
    print()
    print("targets: " + ("all met" if not failures else "MISSED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
