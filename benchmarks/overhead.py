"""Framework overhead: one tiny SD text-to-image call through our blocks and through diffusers' pipeline.

Both run on the very same component objects (a tiny random repo built on the fly), with the same
prompt, seed and steps, alternating call by call so that drifts in machine load hit both alike. Prints
the median time per call of each, the ratio ours / theirs (target <= 1.05) and the difference per call.

    python benchmarks/overhead.py                 # 30 timed pairs after 5 warm-up pairs, 1 CPU thread
    python benchmarks/overhead.py --repeats 100 --threads 2 --output-type latent

Runs in well under a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time

import numpy as np
import torch
from diffusers import StableDiffusionPipeline

from blocks.stable_diffusion import StableDiffusionAutoBlocks, make_tiny_repo


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed calls of each pipeline")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls of each pipeline first")
    parser.add_argument("--steps", type=int, default=2, help="denoising steps per call")
    parser.add_argument("--output-type", default="np", choices=["np", "pt", "pil", "latent"])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; 1 keeps timings stable on a shared machine (spinning threads wait on each other)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)  # diffusers' one-off notices are not part of the measurement

    with tempfile.TemporaryDirectory() as folder:
        ours, theirs = build(make_tiny_repo(folder + "/tiny-sd"))
    inputs = {
        "prompt": "a photo of a cat",
        "num_inference_steps": args.steps,
        "output_type": args.output_type,
    }

    def run_ours():
        generator = torch.Generator("cpu").manual_seed(0)
        return ours(generator=generator, output="images", **inputs)

    def run_theirs():
        generator = torch.Generator("cpu").manual_seed(0)
        return theirs(generator=generator, **inputs).images

    first_ours, first_theirs = run_ours(), run_theirs()
    if args.output_type in ("np", "pt", "latent"):
        same = np.array_equal(np.asarray(first_ours), np.asarray(first_theirs))
    else:
        same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first_ours, first_theirs))
    for _ in range(args.warmup):
        run_ours()
        run_theirs()

    times = {"ours": [], "theirs": []}
    runners = [("ours", run_ours), ("theirs", run_theirs)]
    for i in range(args.repeats):
        # Alternate who goes first, so neither always runs on a warmer cache.
        for name, runner in runners if i % 2 == 0 else runners[::-1]:
            start = time.perf_counter()
            runner()
            times[name].append(time.perf_counter() - start)

    ours_median = statistics.median(times["ours"])
    theirs_median = statistics.median(times["theirs"])
    ratio = ours_median / theirs_median
    print(
        f"tiny SD text-to-image, {args.steps} steps, output_type={args.output_type!r}, "
        f"{args.repeats} alternating pairs after {args.warmup} warm-up pairs, {torch.get_num_threads()} thread(s)"
    )
    print(f"outputs identical: {same}")
    print(f"ours   (modular blocks)          median {ours_median * 1e3:8.2f} ms/call")
    print(f"theirs (StableDiffusionPipeline) median {theirs_median * 1e3:8.2f} ms/call")
    print(f"difference per call: {(ours_median - theirs_median) * 1e3:+.2f} ms")
    print(f"ratio ours/theirs: {ratio:.3f} (target <= 1.05: {'met' if ratio <= 1.05 else 'NOT met'})")


if __name__ == "__main__":
    main()
