"""Start-up: cold-interpreter wall times of our command line and imports beside the peer's import.

Run: .venv/bin/python benchmarks/startup.py [--rounds 7] [--only NAME ...] [--family stable_diffusion]

Each measurement is one fresh interpreter (``python -c CODE`` or ``python -m modular --help``), timed from
the parent, interpreter start included. The commands run round-robin, ``--rounds`` rounds, each round in
a rotated order, so that a drift in machine load hits every command alike; the table shows each command's
median and its ratio to the peer's ``import diffusers.modular_pipelines``. The first ``from_pretrained``
loads a tiny repo that is built once beforehand with the family's tiny builder (the timed child only
imports and loads; no weights, as ``from_pretrained`` loads none). Targets: ``modular --help`` <= 0.1x
the peer's import; ``import blocks.flux`` <= 1.0x the peer's import.

Before and after lazy start-up (issue 21): medians of 3 rounds on 2 CPU cores shared with other jobs, so the
seconds swing with the load (the peer's import took 32 s and 22 s in these runs, about 5 s on an idle
machine) and the ratios by a few tenths between runs. Before, the family packages imported every module,
so the "+ its blocks" rows measure what the plain ones did. The first from_pretrained took 42.9 s and
43.3 s: it binds every component's class, so it imports the models either way.

    command                                       before    after
    modular --help                                1.04x     0.02x   (target <= 0.1x)
    import modular                                1.09x     0.02x
    import blocks.stable_diffusion                1.51x     0.04x
    import blocks.flux                            1.81x     0.03x   (target <= 1.0x)
    import blocks.stable_diffusion + its blocks   1.64x     0.74x
    import blocks.stable_diffusion_xl + ...       1.30x     0.77x
    import blocks.flux + its blocks               1.84x     0.95x   (target <= 1.0x)
    import blocks.z_image + its blocks            1.62x     1.14x
    import torch                                  0.45x     0.53x
    first from_pretrained (tiny SD)               1.33x     1.96x
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER = "import diffusers.modular_pipelines"
FAMILIES = ("stable_diffusion", "stable_diffusion_xl", "flux", "z_image", "flux2", "sd3", "qwenimage", "wan")
TARGETS = {"modular --help": 0.1, "import blocks.flux": 1.0, "import blocks.flux + its blocks": 1.0}
FROM_PRETRAINED = "first from_pretrained"


def commands(repo: str | None) -> dict[str, list[str]]:
    """Every measured command by its label: the argv after the interpreter."""
    found = {
        "modular --help": ["-m", "modular", "--help"],
        "import modular": ["-c", "import modular"],
        **{f"import blocks.{name}": ["-c", f"import blocks.{name}"] for name in FAMILIES},
        # The family's blocks class too: every module of its blocks (the package alone may import none).
        **{
            f"import blocks.{name} + its blocks": [
                "-c",
                f"import blocks.{name}; blocks.{name}.FAMILY.blocks_class",
            ]
            for name in FAMILIES
        },
        PEER: ["-c", PEER],
        "import torch": ["-c", "import torch"],
    }
    if repo is not None:
        found[FROM_PRETRAINED] = [
            "-c",
            f"from modular import ModularPipeline; ModularPipeline.from_pretrained({repo!r})",
        ]
    return found


def time_once(argv: list[str]) -> float:
    """Seconds of one cold interpreter running ``argv``; a failed run stops the benchmark with its stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"python {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def measure(chosen: dict[str, list[str]], rounds: int) -> dict[str, float]:
    """The median seconds of each command over ``rounds`` round-robin rounds, each in a rotated order."""
    labels = list(chosen)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for i in range(rounds):
        shift = i % len(labels)
        for label in labels[shift:] + labels[:shift]:
            times[label].append(time_once(chosen[label]))
    return {label: statistics.median(values) for label, values in times.items()}


def table(medians: dict[str, float]) -> list[str]:
    """One line per command: median seconds, ratio to the peer's import, and the target where there is one."""
    peer = medians[PEER]
    lines = [f"{'command':<46} {'median s':>9} {'x peer':>7}  target"]
    for label, seconds in medians.items():
        target = TARGETS.get(label)
        verdict = (
            "" if target is None else f"<= {target:.1f}x " + ("ok" if seconds / peer <= target else "MISSED")
        )
        lines.append(f"{label:<46} {seconds:9.2f} {seconds / peer:6.2f}x  {verdict}".rstrip())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=7, help="round-robin rounds (each command once per round)"
    )
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="measure only these commands (the peer's import always)"
    )
    parser.add_argument(
        "--family", default="stable_diffusion", choices=FAMILIES, help="whose tiny repo from_pretrained loads"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        wanted = args.only is None or FROM_PRETRAINED in args.only
        repo = _tiny_repo(args.family, Path(scratch) / "tiny") if wanted else None
        every = commands(repo)
        unknown = sorted(set(args.only or ()) - set(every))
        if unknown:
            parser.error(f"unknown command(s) {unknown}; choose from {list(every)}")
        chosen = {k: v for k, v in every.items() if args.only is None or k in args.only or k == PEER}
        medians = measure(chosen, args.rounds)
    print(
        f"cold interpreters, medians of {args.rounds} round-robin round(s), "
        f"ratios to the peer's `{PEER}` ({FROM_PRETRAINED}: the tiny {args.family} repo)"
    )
    for line in table(medians):
        print(line)
    return 0


def _tiny_repo(family: str, folder: Path) -> str:
    """The family's tiny random repo, written in a child so that this process stays light."""
    code = f"import blocks.{family} as family; print(family.make_tiny_repo({str(folder)!r}))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    sys.exit(main())
