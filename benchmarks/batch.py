"""Batch throughput: images per second for 1 and 2 CPU processes on the tiny Stable Diffusion repo.

Run: .venv/bin/python benchmarks/batch.py [--entries 32] [--steps 2] [--size 64]

Runs the same job with `python -m modular batch` (1 process) and under `torch.distributed.run
--nproc-per-node 2` (2 gloo ranks), each process with one thread, into fresh output folders, and prints
per process count: the command's wall time (interpreter start, imports, rendezvous and loading
included), the run's own time (from the manifest: checks, loading, generation, the manifest) and the
generation time (the slowest rank's sum of per-entry seconds, from the sidecars), as images per second,
and the scaling of 2 processes over 1. Two CPU cores bound it: the ideal is 2x, less what the two
processes take from each other (memory bandwidth, and whatever else runs on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(job: Path, processes: int) -> dict[str, float]:
    """Run the job on ``processes`` processes; wall, run and generation seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    batch = ["-m", "modular", "batch", str(job), "--threads", "1", "--quiet"]
    if processes == 1:
        command = [sys.executable, *batch]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
        command += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *batch]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    out = job.parent / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    per_rank: dict[int, float] = defaultdict(float)
    for row in manifest["entries"]:
        per_rank[row["rank"]] += row["seconds"]
    return {"wall": wall, "run": manifest["seconds"], "generation": max(per_rank.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=32, help="images in the job (default 32)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--size", type=int, default=64, help="width and height in pixels")
    args = parser.parse_args()

    from blocks.stable_diffusion import make_tiny_repo

    with tempfile.TemporaryDirectory(prefix="batch-bench-") as scratch:
        repo = make_tiny_repo(Path(scratch) / "tiny-sd")
        results = {}
        for processes in (1, 2):
            folder = Path(scratch) / f"{processes}-processes"
            folder.mkdir()
            job = {
                "output": "out",
                "seed": 0,
                "steps": args.steps,
                "sizes": [f"{args.size}x{args.size}"],
                "prompts": [f"prompt number {n}" for n in range(args.entries)],
                "workflows": [{"name": "sd", "repo": str(repo), "workflow": "text2image"}],
            }
            (folder / "job.json").write_text(json.dumps(job))
            results[processes] = _run(folder / "job.json", processes)

    n = args.entries
    print(
        f"Batch throughput, tiny Stable Diffusion repo: {n} images, {args.steps} steps, {args.size}x{args.size},"
    )
    print(f"one thread per process, {os.cpu_count()} CPU cores")
    print(
        f"{'processes':>9}  {'wall s':>7}  {'img/s':>6}  {'run s':>6}  {'img/s':>6}  {'generation s':>12}  {'img/s':>6}"
    )
    for processes, r in results.items():
        print(
            f"{processes:>9}  {r['wall']:>7.2f}  {n / r['wall']:>6.2f}  {r['run']:>6.2f}  {n / r['run']:>6.2f}  "
            f"{r['generation']:>12.2f}  {n / r['generation']:>6.2f}"
        )
    for key, label in (("wall", "whole command"), ("run", "the run"), ("generation", "generation")):
        print(f"scaling, 2 processes over 1 ({label}): {results[1][key] / results[2][key]:.2f}x (ideal 2x)")


if __name__ == "__main__":
    main()
