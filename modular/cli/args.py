"""The command line's options: what each subcommand takes, declared without importing torch or models.

``modular --help``, ``modular families`` and every refused argument run on these alone (and the value types
of ``cli_types``), so they answer at once; the subcommands that run models import them when they run.
"""

from __future__ import annotations

import argparse

from modular.batch.job_values import DTYPE_NAMES, OFFLOADS
from modular.cli.arg_types import byte_size, names, positive_int, seed_number

__all__ = [
    "BATCH_DESCRIPTION",
    "DEFAULT_FAMILY",
    "DEFAULT_PROMPT",
    "RUN_DESCRIPTION",
    "add_batch_arguments",
    "add_job_arguments",
]

RUN_DESCRIPTION = """\
Without REPO: the built-in scenario (FLUX.1 text-to-image, then Canny and Depth control, on tiny repos
built on the fly, one components manager, auto offload). With REPO: that repo's pipeline.

  modular run REPO [job and run options] --then REPO_B [job options] --then ...

runs several repos on one components manager, so what they share is loaded once. A job after --then
keeps the previous job's prompt, negative prompt, steps, seed, size, guidance, number of images and
dtype unless it sets them; its workflow, images, variant, revision and --reuse are its own. Options
of the whole run (--offload, --budget, --margin, --output, --quiet) go before the first --then."""
DEFAULT_PROMPT = "a photo of an astronaut riding a horse"
DEFAULT_FAMILY = "stable-diffusion"
BATCH_DESCRIPTION = """\
Generate every entry of a job file (JSON, or TOML on Python 3.11+): each prompt through each workflow, at
each size, images_per_prompt times. Outputs are written atomically beside a JSON sidecar; run the same
command again after a crash and finished entries are skipped. Under torchrun or accelerate launch each
process runs every N-th entry on its own device (cuda:LOCAL_RANK); rank 0 shows the progress bar and
writes manifest.json. See docs/batch.md.

  modular batch job.json
  torchrun --nproc-per-node 4 -m modular batch job.json
  modular batch job.json --dry-run --ranks 4"""


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of one job (also those after ``--then``)."""
    parser.add_argument("--prompt", help=f"what to draw (default {DEFAULT_PROMPT!r})")
    parser.add_argument("--negative-prompt", help="what to steer away from, for pipelines that take one")
    parser.add_argument("--workflow", help="prune to one named workflow (see `modular families`)")
    parser.add_argument("--image", help="the input image of image-to-image and inpainting (a file)")
    parser.add_argument("--mask", help="the inpainting mask (a file; white is repainted)")
    parser.add_argument("--control-image", help="the control image of a control workflow (a file)")
    parser.add_argument(
        "--steps", type=positive_int, help="denoising steps, at least 1 (default: the pipeline's)"
    )
    parser.add_argument(
        "--seed", type=seed_number, help="seed of the CPU generator, 0 to 2**63-1 (default 0)"
    )
    parser.add_argument("--height", type=positive_int, help="image height in pixels")
    parser.add_argument("--width", type=positive_int, help="image width in pixels")
    parser.add_argument("--guidance-scale", type=float, help="guidance scale")
    parser.add_argument("--num-images", type=positive_int, help="images per prompt")
    parser.add_argument(
        "--dtype", choices=["auto", *DTYPE_NAMES], help="weights dtype (auto: bfloat16 on CUDA, else float32)"
    )
    parser.add_argument("--variant", help="weights variant, e.g. fp16")
    parser.add_argument("--revision", help="hub revision: branch, tag or commit")
    parser.add_argument(
        "--reuse",
        type=names,
        metavar="NAME[,NAME...]",
        help="after --then: take these components from the previous job instead of loading them "
        "(e.g. text_encoder,text_encoder_2,tokenizer,tokenizer_2,vae,scheduler)",
    )


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``modular batch``."""
    parser.add_argument("job", metavar="JOB", help="the job file (.json, or .toml on Python 3.11+)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print each rank's entries and the components to load; load no weights, write nothing",
    )
    parser.add_argument(
        "--ranks",
        type=positive_int,
        help="with --dry-run: split for this many processes (default: WORLD_SIZE, else 1)",
    )
    parser.add_argument(
        "--offload",
        choices=OFFLOADS,
        default="none",
        help="none: every model on the rank's device (default); auto: auto offload onto cuda:LOCAL_RANK; "
        "sim: auto offload onto a simulated device of --budget",
    )
    parser.add_argument(
        "--budget", type=byte_size, help="device bytes the weights may use on each rank, e.g. 8GB"
    )
    parser.add_argument("--margin", type=byte_size, help="bytes kept free on each rank's device")
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads per process")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
