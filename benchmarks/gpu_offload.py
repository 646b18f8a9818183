"""Three Flux-shaped workflows on one CUDA device under a memory cap: our offload vs the peer's three.

Models are stand-ins (``gpu_methods.Chain``: a ``proj_in`` and a ``blocks`` list of bf16 square Linears
with seeded random weights) sized like the seed's Flux components scaled by ``--scale`` (default 1/8:
CLIP 0.03, T5 1.11, three transformers 2.77 each, VAE 0.02 GiB); real Flux pipelines would take far longer
to build than the moves we measure. Each input has ``--tokens`` rows (4096: Flux's 1024x1024 latents), so
each byte of weight meets a 1024x1024 step's matmul work; Flux's attention adds compute that these
models lack, so copies weigh more here than in Flux. Each method runs text2img, canny, depth, twice
(``--repeats``), denoising loops capped at ``--steps``; each model's output feeds the next.

Rows (``cap`` is set with ``torch.cuda.set_per_process_memory_fraction``; ``--margin-gb`` is kept free
for activations by both managers):

- ours: ``offload.OffloadEngine`` (next use, pinned host copies, nothing copied back), a plan per
  workflow, at ``--budget-gb`` (the transformers cannot all stay resident); then with ``prefetch``
  (the plan's next model copied on a side stream while the current one computes); then with prefetch and
  ``shrink_victims`` off (victims leave whole; on by default: a victim may keep a resident prefix);
- ours streaming: at ``--stream-budget-gb``, below one transformer, so each denoiser keeps a resident
  prefix of its blocks and streams the rest every step; without and with prefetch (the next block
  copied on a side stream);
- diffusers ``ComponentsManager.enable_auto_cpu_offload`` (smallest sufficient set, ``.to()`` both ways);
- ``enable_model_cpu_offload`` (approx.): accelerate's ``cpu_offload_with_hook`` chained over each
  workflow's models, every model offloaded after each call, as diffusers builds it;
- diffusers group offloading: ``apply_group_offloading`` block level, one block per group,
  ``use_stream=True``, on every model, at the streaming cap (it moves every block in for every call at
  any cap).

Columns: wall seconds (the workflows only: attaching, pinning and hooking happen before); wall time over
our first row; peak allocated GiB (``max_memory_allocated``; on the CPU our engine's resident weights);
host-to-device and device-to-host GiB (ours from its log, the peer's managers counted at their
``.to()``; ``-`` where unknown); ``equal``: every workflow's final output ``torch.equal`` to a reference
computed once on the same device without offload (each model moved in by hand for its use, then out).
Exit status 1 when a row fails or one of ours is not equal.

Run: ``python benchmarks/gpu_offload.py`` (needs CUDA and about 40 GB of host memory; estimated at two
minutes on an H200, most of it copying and pinning weights between rows; scripts/gpu_check.sh runs it).
``--device cpu --smoke``: tiny models, our rows on a
``SimulatedDevice`` of each cap, the peer rows that need CUDA skipped with the reason; seconds, run by
tests/test_benchmarks.py so that everything but the CUDA calls is tested before the GPU run.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
import torch._dynamo  # noqa: F401  (imported by the peer's hooks at their first call: not inside a timing)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_methods import (  # noqa: E402
    SIZES_GB,
    Bench,
    Method,
    Result,
    Target,
    build,
    chain_nbytes,
    ours,
    peer_group_offload,
    peer_manager,
    peer_model_offload,
    reference,
    run_method,
    workflow_inputs,
)

import components.quiet_imports  # noqa: E402, F401  (the peer rows import diffusers: no torchao noise)
from offload.devices.units import GiB  # noqa: E402  (1024**3: the GiB the manager table prints)

SMOKE = {"width": 64, "tokens": 4, "steps": 3, "repeats": 1}
SMOKE_TRANSFORMER_BLOCKS = 12
SMOKE_CAPS = (1.8, 0.6)  # --budget-gb and --stream-budget-gb, in transformers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a SimulatedDevice")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny models (seconds); caps set from their sizes"
    )
    parser.add_argument("--scale", type=float, default=1 / 8, help="component sizes relative to Flux bf16")
    parser.add_argument("--width", type=int, default=2048, help="features of each Linear")
    parser.add_argument("--tokens", type=int, default=4096, help="rows of each input")
    parser.add_argument("--budget-gb", type=float, default=5.0, help="the device cap, in GiB (1024**3 bytes)")
    parser.add_argument(
        "--stream-budget-gb", type=float, default=2.0, help="a cap below one transformer, in GiB"
    )
    parser.add_argument("--margin-gb", type=float, default=0.5, help="kept free for activations, in GiB")
    parser.add_argument("--steps", type=int, default=8, help="loop steps per denoiser (capped)")
    parser.add_argument("--repeats", type=int, default=2, help="times the three workflows run")
    args = parser.parse_args(argv)
    if args.smoke and args.device == "cuda":
        parser.error(
            "--smoke sizes caps in kilobytes, below what the CUDA allocator can work in: add --device cpu"
        )
    if args.smoke:
        vars(args).update(SMOKE, margin_gb=0.0)
        args.scale = SMOKE_TRANSFORMER_BLOCKS * args.width**2 * 2 / (SIZES_GB["transformer"] * GiB)
    return args


def check_caps(sizes: dict[str, int], budget: int, stream_budget: int, margin: int) -> str | None:
    """Why the caps cannot show what the rows are for, or None."""
    largest = max(sizes.values())
    if budget - margin < largest:
        return (
            f"--budget-gb ({budget / GiB:.2f}) less --margin-gb ({margin / GiB:.2f}) must hold the largest model "
            f"({largest / GiB:.2f} GiB), or the peer's whole-model offloads cannot run. Raise --budget-gb."
        )
    if stream_budget - margin >= sizes["transformer"]:
        return (
            f"--stream-budget-gb ({stream_budget / GiB:.2f}) less --margin-gb ({margin / GiB:.2f}) must be below "
            f"one transformer ({sizes['transformer'] / GiB:.2f} GiB), or nothing streams. Lower --stream-budget-gb."
        )
    return None


class Row(NamedTuple):
    """A row to run: its method, or why it is skipped on this device."""

    label: str
    cap: int
    method: Method | None
    skip: str = ""


def rows(budget: int, stream_budget: int, cuda: bool) -> list[Row]:
    """The rows in table order."""

    def row(label: str, cap: int, method: Callable[..., Result], **options: bool) -> Row:
        return Row(label, cap, partial(method, label=label, **options))

    group = "diffusers group offload (stream)" if cuda else "diffusers group offload (cpu: no stream)"
    manager = "diffusers ComponentsManager"
    return [
        row("ours (NextUse)", budget, ours, prefetch=False),
        row("ours + prefetch", budget, ours, prefetch=True),
        row("ours + prefetch, victims whole", budget, ours, prefetch=True, shrink=False),
        row("ours streaming", stream_budget, ours, prefetch=False),
        row("ours streaming + prefetch", stream_budget, ours, prefetch=True),
        row(manager, budget, peer_manager)
        if cuda
        else Row(
            manager, budget, None, "needs CUDA: its AutoOffloadStrategy reads the device's mem_get_info"
        ),
        row("enable_model_cpu_offload (approx.)", budget, peer_model_offload),
        row(group, stream_budget, peer_group_offload),
    ]


def run_rows(bench: Bench, pristine: dict, planned: list[Row]) -> tuple[list[Result], list[str], bool]:
    """Run each row on fresh copies of ``pristine``; returns the results, the notes on rows skipped or
    failed, and whether the run failed (a row raised, or one of ours is not equal)."""
    results: list[Result] = []
    notes: list[str] = []
    failed = False
    for label, cap, method, skip in planned:
        if method is None:
            notes.append(f"{label}: skipped ({skip})")
            continue
        started = time.perf_counter()
        try:
            result = run_method(bench, pristine, cap, method)
        except Exception as error:  # one broken row must not lose the others on a one-shot GPU run
            traceback.print_exc()
            notes.append(f"{label}: FAILED ({type(error).__name__}: {error})")
            failed = True
            continue
        results.append(result)
        decisions = ", ".join(f"{reason} {n}" for reason, n in sorted(result.reasons.items()))
        overall = time.perf_counter() - started
        print(
            f"  {label}: {result.wall_s:.3f} s timed ({overall:.1f} s with copying, pinning, hooking), equal "
            f"{result.equal}{'; ' if decisions else ''}{decisions}",
            flush=True,
        )
        failed |= result.ours and not result.equal
    return results, notes, failed


def table(results: list[Result], unit: tuple[str, int] = ("GiB", GiB)) -> str:
    """The results as a fixed-width table, sizes in ``unit``; ``x ours`` is relative to our first row."""
    name, size = unit

    def cell(nbytes: int | None) -> str:
        return "-" if nbytes is None else f"{nbytes / size:.2f}"

    base = next((r.wall_s for r in results if r.ours), float("nan"))
    heads = [f"cap {name}", "wall s", "x ours", f"peak {name}", f"h2d {name}", f"d2h {name}"]
    lines = [f"{'method':<40} " + " ".join(f"{h:>8}" for h in heads) + " equal"]
    for r in results:
        cells = [
            cell(r.cap),
            f"{r.wall_s:.3f}",
            f"{r.wall_s / base:.2f}",
            cell(r.peak),
            cell(r.h2d),
            cell(r.d2h),
        ]
        lines.append(
            f"{r.method:<40} " + " ".join(f"{c:>8}" for c in cells) + f" {'yes' if r.equal else 'NO'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every row and print the table; returns the exit status (2: caps that cannot show streaming)."""
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("needs CUDA; without a GPU run with --device cpu --smoke, or benchmarks/offload_streaming.py")
        return 1
    width = args.width
    sizes = {name: chain_nbytes(int(gb * GiB * args.scale), width) for name, gb in SIZES_GB.items()}
    budget, stream_budget, margin = (
        int(v * GiB) for v in (args.budget_gb, args.stream_budget_gb, args.margin_gb)
    )
    if args.smoke:
        budget, stream_budget = (int(share * sizes["transformer"]) for share in SMOKE_CAPS)
    problem = check_caps(sizes, budget, stream_budget, margin)
    if problem is not None:
        print(problem)
        return 2
    unit = ("GiB", GiB) if sizes["transformer"] >= GiB // 100 else ("KiB", 1024)  # the smoke run's are KiB
    listed = ", ".join(f"{n} {s / unit[1]:.2f}" for n, s in sizes.items())
    print(
        f"device {'cuda:0' if cuda else 'cpu (our rows on a SimulatedDevice of each cap)'}; components "
        f"({unit[0]}): {listed}; caps {budget / unit[1]:.2f} and {stream_budget / unit[1]:.2f} {unit[0]}, "
        f"margin {margin / unit[1]:.2f} {unit[0]}; width {width}, tokens {args.tokens}, steps <= {args.steps}, "
        f"repeats {args.repeats}",
        flush=True,
    )
    target = Target(cuda, margin)
    if cuda:
        warm = torch.randn(width, width, device="cuda", dtype=torch.bfloat16)
        (warm @ warm).sum().item()  # cuBLAS and the allocator start before the first timed method
        del warm
    pristine = build(sizes, width, target.device)
    order = ["text2img", "canny", "depth"] * args.repeats
    inputs = workflow_inputs(order, args.tokens, width)
    target.set_cap(budget)
    references = {w: reference(pristine, w, x, args.steps, target.device) for w, x in inputs.items()}
    bench = Bench(target, inputs, references, order, args.steps)
    results, notes, failed = run_rows(bench, pristine, rows(budget, stream_budget, cuda))
    print(table(results, unit))
    for note in notes:
        print(note)
    if not cuda:
        print(f"peak {unit[0]} on the CPU: our engine's peak resident weights on the SimulatedDevice.")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
