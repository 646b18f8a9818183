"""Framework overhead: tiny SD text-to-image calls through our blocks and through diffusers' pipeline.

Both run on the very same component objects (a tiny random repo built on the fly), with the same
prompt, seed and steps, alternating call by call so that drifts in machine load hit both alike. Two
runs, each printing the median time per call of each side, the ratio ours / theirs and the difference
per call:

- ``default``: the configured call (``--steps``, ``--output-type``; target ratio <= 1.05);
- ``python``: where Python overhead dominates: 1 step, 64x64, ``output_type="latent"`` (no decode), so
  planning, state handling and block dispatch weigh most. Its ratio must not grow as the framework
  changes: 0.98x before the single walk with its cached plan, 0.96x after (medians of five runs of 60
  pairs on 2 shared CPU cores; planning a call went from about 0.9 ms to under 0.01 ms). Asking a guider
  component (issue 11) left both runs as they were: default 0.97x/0.97x, python 0.96x/0.96x before/after
  (medians of three runs of 40 pairs). Watching calls (issue 23) left a call given no watching keyword as it
  was: python 0.987x/0.951x before, 0.944x/0.930x after (two runs each of 40 pairs, alternating checkouts).
- ``watch``: our call with each watching keyword against the same call with none (4 steps, 64x64, latents
  out, where the per-step cost shows): an empty step callback 0.970x, an empty ``on_progress`` 0.981x, an unset
  cancel token 1.013x, a preview every step 0.996x (40 rounds after 5 warm-up rounds): within the noise.

    python benchmarks/overhead.py                 # both runs: 30 timed pairs after 5 warm-up pairs, 1 thread
    python benchmarks/overhead.py --run python --repeats 100
    python benchmarks/overhead.py --run default --threads 2 --output-type latent
    python benchmarks/overhead.py --run grad      # inference_mode + clones (ours) vs no_grad
    python benchmarks/overhead.py --run watch --steps 4   # step callbacks, progress, cancel, previews vs none
    python benchmarks/overhead.py --run families  # every family vs its classic pipeline and the peer's
                                                  # (benchmarks/family_overhead.py, which takes --families)

Runs in well under a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import torch
from diffusers import StableDiffusionPipeline

import modular.pipeline.pipeline
from blocks.stable_diffusion import StableDiffusionAutoBlocks, make_tiny_repo

PROMPT = "a photo of a cat"


def build(repo):
    """Our pipeline on `repo` and the classic pipeline on the same component objects, bars off."""
    ours = StableDiffusionAutoBlocks().init_pipeline(repo)
    ours.load_components(torch_dtype=torch.float32)
    ours.set_progress_bar_config(disable=True)
    theirs = StableDiffusionPipeline(
        vae=ours.vae,
        text_encoder=ours.text_encoder,
        tokenizer=ours.tokenizer,
        unet=ours.unet,
        scheduler=ours.scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    theirs.set_progress_bar_config(disable=True)
    return ours, theirs


def runners(ours, theirs, inputs: dict[str, Any]) -> list[tuple[str, Callable[[], Any]]]:
    """One call of each side with these inputs and a fresh generator seeded 0; each returns the images."""

    def run_ours():
        generator = torch.Generator("cpu").manual_seed(0)
        return ours(generator=generator, output="images", **inputs)

    def run_theirs():
        generator = torch.Generator("cpu").manual_seed(0)
        return theirs(generator=generator, **inputs).images

    return [("ours", run_ours), ("theirs", run_theirs)]


def identical(first_ours: Any, first_theirs: Any, output_type: str) -> bool:
    if output_type in ("np", "pt", "latent"):
        return bool(np.array_equal(np.asarray(first_ours), np.asarray(first_theirs)))
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first_ours, first_theirs))


def measure(pair: list[tuple[str, Callable[[], Any]]], repeats: int, warmup: int) -> dict[str, float]:
    """Median seconds per call of each side, timed in alternating pairs after `warmup` untimed pairs."""
    for _ in range(warmup):
        for _, runner in pair:
            runner()
    times: dict[str, list[float]] = {name: [] for name, _ in pair}
    for i in range(repeats):
        # Alternate who goes first, so neither always runs on a warmer cache.
        for name, runner in pair if i % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            runner()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def report(title: str, inputs: dict[str, Any], ours, theirs, args, target: str) -> None:
    pair = runners(ours, theirs, inputs)
    same = identical(pair[0][1](), pair[1][1](), inputs["output_type"])
    medians = measure(pair, args.repeats, args.warmup)
    ratio = medians["ours"] / medians["theirs"]
    print(
        f"[{title}] tiny SD text-to-image, {inputs['num_inference_steps']} step(s), "
        f"output_type={inputs['output_type']!r}"
        + (f", {inputs['height']}x{inputs['width']}" if "height" in inputs else "")
        + f", {args.repeats} alternating pairs after {args.warmup} warm-up pairs, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"  outputs identical: {same}")
    print(f"  ours   (modular blocks)          median {medians['ours'] * 1e3:8.2f} ms/call")
    print(f"  theirs (StableDiffusionPipeline) median {medians['theirs'] * 1e3:8.2f} ms/call")
    print(f"  difference per call: {(medians['ours'] - medians['theirs']) * 1e3:+.2f} ms")
    print(f"  ratio ours/theirs: {ratio:.3f} ({target})")


def grad_mode_runners(ours, inputs: dict[str, Any]) -> list[tuple[str, Callable[[], Any]]]:
    """Our call as it is (under ``torch.inference_mode()``, returned tensors cloned into ordinary ones), as it
    was (the inference tensors returned as they are: they cannot be changed in place), and run under
    ``torch.no_grad()`` instead (the other way to return ordinary tensors). The last two swap a name for the
    duration of the call."""

    def as_it_is():
        return ours(generator=torch.Generator("cpu").manual_seed(0), output="images", **inputs)

    def without_clones():
        with mock.patch.object(
            modular.pipeline.pipeline, "call_result", lambda state, output: state.get(output)
        ):
            return as_it_is()

    def under_no_grad():
        with mock.patch.object(torch, "inference_mode", torch.no_grad):
            return as_it_is()

    return [
        ("inference_mode (as was)", without_clones),
        ("inference_mode + clones", as_it_is),
        ("no_grad", under_no_grad),
    ]


def report_grad_modes(ours, args) -> None:
    """Medians of our call in each grad mode, on a tensor output: the default run's and the python run's."""
    for title, steps, size in (("default", args.steps, {}), ("python", 1, {"height": 64, "width": 64})):
        inputs = {"prompt": PROMPT, "num_inference_steps": steps, "output_type": "pt", **size}
        modes = grad_mode_runners(ours, inputs)
        outputs = [runner() for _, runner in modes]
        same = all(torch.equal(outputs[0], other) for other in outputs[1:])
        medians = measure(modes, args.repeats, args.warmup)
        base = medians["inference_mode (as was)"]
        print(
            f"[grad/{title}] tiny SD text-to-image, {steps} step(s), output_type='pt', {args.repeats} "
            f"alternating rounds after {args.warmup} warm-up rounds, {torch.get_num_threads()} thread(s)"
        )
        print(f"  outputs identical: {same}")
        for (name, _), out in zip(modes, outputs, strict=True):
            median = medians[name]
            print(
                f"  {name:<24} median {median * 1e3:8.2f} ms/call  ratio to as was {median / base:.3f}  "
                f"output changeable in place: {not out.is_inference()}"
            )


def watch_runners(ours, inputs: dict[str, Any], previews: bool) -> list[tuple[str, Callable[[], Any]]]:
    """Our call with none of the watching keywords (no CallWatch is made), with a step callback that changes
    nothing, with an ``on_progress`` that does nothing, with an unset cancel token, and (where the family has a
    latent-to-RGB map) with a preview every step."""
    from modular import CancelToken

    def call(**watching: Any) -> Callable[[], Any]:
        def run():
            generator = torch.Generator("cpu").manual_seed(0)
            return ours(generator=generator, output="images", **inputs, **watching)

        return run

    modes = [
        ("no keyword", call()),
        ("empty callback", call(callback_on_step_end=lambda pipe, i, t, tensors: {})),
        ("empty on_progress", call(on_progress=lambda event: None)),
        ("unset cancel", call(cancel=CancelToken())),
    ]
    if previews:
        modes.append(("preview every step", call(preview_every=1, on_preview=lambda preview: None)))
    return modes


def report_watch(ours, args) -> None:
    """Medians of our call with each watching keyword, against the same call with none, on the Python-bound
    run (64x64, latents out) with ``--steps`` steps, so the per-step cost shows."""
    inputs = {
        "prompt": PROMPT,
        "num_inference_steps": args.steps,
        "output_type": "latent",
        "height": 64,
        "width": 64,
    }
    previews = any(loop.offers_previews() for loop in _loops_under(ours.blocks))
    modes = watch_runners(ours, inputs, previews)
    outputs = [runner() for _, runner in modes]
    same = all(torch.equal(outputs[0], other) for other in outputs[1:])
    medians = measure(modes, args.repeats, args.warmup)
    base = medians["no keyword"]
    print(
        f"[watch] tiny SD text-to-image, {args.steps} step(s), 64x64, output_type='latent', {args.repeats} "
        f"alternating rounds after {args.warmup} warm-up rounds, {torch.get_num_threads()} thread(s)"
    )
    print(f"  outputs identical: {same}")
    for name, _ in modes:
        median = medians[name]
        print(f"  {name:<20} median {median * 1e3:8.2f} ms/call  ratio to no keyword {median / base:.3f}")


def _loops_under(block) -> list[Any]:
    from modular import LoopSequentialPipelineBlocks

    found = [block] if isinstance(block, LoopSequentialPipelineBlocks) else []
    for child in block.sub_blocks.values():
        found += _loops_under(child)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--run",
        default="both",
        choices=["both", "default", "python", "grad", "watch", "families"],
        help="which runs (families: benchmarks/family_overhead.py, a row per installed family)",
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed calls of each pipeline")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls of each pipeline first")
    parser.add_argument("--steps", type=int, default=2, help="denoising steps per call (default run)")
    parser.add_argument("--output-type", default="np", choices=["np", "pt", "pil", "latent"])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; 1 keeps timings stable on a shared machine (spinning threads wait on each other)",
    )
    args = parser.parse_args()
    if args.run == "families":
        import family_overhead  # benchmarks/family_overhead.py, beside this script

        sys.argv = [sys.argv[0], "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
        sys.argv += ["--steps", str(args.steps)]
        sys.exit(family_overhead.main())
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)  # diffusers' one-off notices are not part of the measurement

    with tempfile.TemporaryDirectory() as folder:
        ours, theirs = build(make_tiny_repo(folder + "/tiny-sd"))

    if args.run in ("both", "default"):
        inputs = {"prompt": PROMPT, "num_inference_steps": args.steps, "output_type": args.output_type}
        report("default", inputs, ours, theirs, args, "target <= 1.05")
    if args.run in ("both", "python"):
        inputs = {
            "prompt": PROMPT,
            "num_inference_steps": 1,
            "output_type": "latent",
            "height": 64,
            "width": 64,
        }
        report("python", inputs, ours, theirs, args, "Python overhead dominates; must not grow")
    if args.run == "grad":
        report_grad_modes(ours, args)
    if args.run == "watch":
        report_watch(ours, args)


if __name__ == "__main__":
    main()
