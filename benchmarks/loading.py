"""Loading the tiny SD repo: our manager vs diffusers, and a second pipeline that shares components.

Run: .venv/bin/python benchmarks/loading.py [--repeats 15]

Prints median wall times and ratios:
  * first load: ModularPipeline.from_pretrained + load_components vs StableDiffusionPipeline.from_pretrained;
  * second pipeline on the same manager (every component reused) vs loading the repo again.
Target: the shared second pipeline is at least 20x faster than loading again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from diffusers import StableDiffusionPipeline  # noqa: E402
from diffusers.utils import logging as diffusers_logging  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from blocks.stable_diffusion import make_tiny_repo  # noqa: E402
from modular import ComponentsManager, ModularPipeline  # noqa: E402


def ours_first(repo: Path) -> tuple[float, ComponentsManager]:
    start = time.perf_counter()
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    return time.perf_counter() - start, cm, pipe


def ours_second(repo: Path, cm: ComponentsManager) -> float:
    start = time.perf_counter()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm, workflow="image2image")
    pipe.load_components(torch_dtype=torch.float32)
    return time.perf_counter() - start


def theirs(repo: Path) -> float:
    start = time.perf_counter()
    StableDiffusionPipeline.from_pretrained(repo, dtype=torch.float32, safety_checker=None)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    diffusers_logging.disable_progress_bar()
    diffusers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as scratch:
        repo = make_tiny_repo(Path(scratch) / "tiny-sd")
        ours_first(repo), theirs(repo)  # warm-up: imports, file cache
        first, peer, second = [], [], []
        for _ in range(args.repeats):  # alternate so drift on a shared machine hits both sides
            elapsed, cm, pipe = ours_first(repo)
            first.append(elapsed)
            second.append(ours_second(repo, cm))
            peer.append(theirs(repo))
            assert pipe.unet is cm.get_one(name="unet")
    med = {
        name: statistics.median(values)
        for name, values in (("first", first), ("peer", peer), ("second", second))
    }
    print(f"repeats: {args.repeats} (median wall time)")
    print(f"  ours, first pipeline (load)          {med['first'] * 1e3:8.1f} ms")
    print(
        f"  diffusers StableDiffusionPipeline     {med['peer'] * 1e3:8.1f} ms   ours/theirs = {med['first'] / med['peer']:.2f}"
    )
    print(f"  ours, second pipeline (all reused)    {med['second'] * 1e3:8.1f} ms")
    print(f"  speed-up of sharing vs loading again  {med['first'] / med['second']:8.1f}x (target >= 20x)")


if __name__ == "__main__":
    main()
