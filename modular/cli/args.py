"""The command line's options: what each subcommand takes, declared without importing torch or models.

``modular --help``, ``modular families`` and every refused argument run on these alone (and the value types
of ``cli_types``), so they answer at once; the subcommands that run models import them when they run.
"""

from __future__ import annotations

import argparse

from modular.batch.job_values import DTYPE_NAMES, OFFLOADS
from modular.cli.arg_types import (
    byte_size,
    gpu_share,
    names,
    non_negative_int,
    non_negative_number,
    port_number,
    positive_int,
    positive_number,
    replica_range,
    seed_number,
)

__all__ = [
    "BATCH_DESCRIPTION",
    "DEFAULT_FAMILY",
    "DEFAULT_PROMPT",
    "RUN_DESCRIPTION",
    "SERVE_DESCRIPTION",
    "SERVE_STATE",
    "add_batch_arguments",
    "add_job_arguments",
    "add_ray_arguments",
    "add_serve_arguments",
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

SERVE_STATE = "modular-serve-state"
SERVE_DESCRIPTION = """\
Serve the given repos and workflows over HTTP from one components manager: a queue that runs next the job
whose models cost least to bring to the device, an HTTP API (OpenAPI schema at /openapi.json) and a page
at /. Each REPO_OR_WORKFLOW is REPO, REPO:WORKFLOW or NAME=REPO[:WORKFLOW]; requests name only these.
Accepted jobs are kept in --state and run again after a restart. With --ray: the same API and page on Ray
Serve, over worker replicas routed by what each holds. See docs/serving.md.

  modular serve ./tiny-sd ./tiny-flux:text2image --offload sim --budget 64MB
  MODULAR_SERVE_TOKEN=... modular serve sd=./my-sd --host 0.0.0.0
  modular serve --ray sd=./my-sd --replicas 4 --gpus-per-replica 0.5"""


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


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``modular serve`` (defaults left ``None`` are those of ``ServerSettings``, ``Limits``,
    ``Fairness`` and ``Scheduler``, said in the help)."""
    parser.add_argument(
        "served",
        nargs="+",
        metavar="REPO_OR_WORKFLOW",
        help="what to serve: REPO, REPO:WORKFLOW or NAME=REPO[:WORKFLOW] (a local folder or hub repo id)",
    )
    where = parser.add_argument_group("where it listens")
    where.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1)")
    where.add_argument(
        "--port",
        metavar="PORT",
        type=port_number,
        default=8188,
        help="the port (default 8188; 0: a free one)",
    )
    where.add_argument(
        "--token",
        metavar="TOKEN",
        help="the bearer token every request but /healthz must carry (or MODULAR_SERVE_TOKEN); needed to "
        "bind any address but loopback",
    )
    where.add_argument(
        "--state",
        metavar="DIR",
        help=f"folder of the job database, results and uploads (default ./{SERVE_STATE}; not with --ray)",
    )
    models = parser.add_argument_group("models")
    models.add_argument(
        "--offload",
        choices=OFFLOADS,
        help="none: models stay on the device they run on; auto: auto offload onto CUDA; sim: auto offload onto "
        "a simulated device of --budget (default: auto with CUDA, else none)",
    )
    models.add_argument(
        "--budget", metavar="SIZE", type=byte_size, help="device bytes the weights may use, e.g. 8GB"
    )
    models.add_argument(
        "--margin",
        metavar="SIZE",
        type=byte_size,
        help="bytes kept free on the device (default 3GB; 0 when simulated)",
    )
    models.add_argument(
        "--host-budget",
        metavar="SIZE",
        type=byte_size,
        help="host bytes the models' host copies may use (default: what is available)",
    )
    models.add_argument(
        "--dtype",
        choices=["auto", *DTYPE_NAMES],
        default="auto",
        help="weights dtype (auto: bfloat16 on CUDA, else float32)",
    )
    models.add_argument("--threads", metavar="N", type=positive_int, help="torch CPU threads")
    queue = parser.add_argument_group("the queue")
    queue.add_argument(
        "--max-queue",
        metavar="N",
        type=positive_int,
        help="waiting jobs at most; one more is refused 429 (default 100)",
    )
    queue.add_argument(
        "--max-wait",
        type=positive_number,
        metavar="S",
        help="seconds a job waits at most before it runs next (default 60)",
    )
    queue.add_argument(
        "--max-bypass",
        metavar="N",
        type=positive_int,
        help="times a job may be passed over before it runs next (default 8)",
    )
    queue.add_argument(
        "--preview-every",
        metavar="N",
        type=non_negative_int,
        help="a preview every N steps (default 1; 0: no previews)",
    )
    limits = parser.add_argument_group("what one request may ask for")
    limits.add_argument(
        "--max-steps", metavar="N", type=positive_int, help="denoising steps per image (default 200)"
    )
    limits.add_argument("--max-images", metavar="N", type=positive_int, help="images per request (default 8)")
    limits.add_argument(
        "--max-pixels",
        metavar="N",
        type=positive_int,
        help="pixels per image, made or given (default 4194304: 2048x2048)",
    )
    limits.add_argument(
        "--max-body",
        metavar="SIZE",
        type=byte_size,
        help="bytes of a request body, uploads included (default 32MiB)",
    )
    limits.add_argument(
        "--max-upload", metavar="SIZE", type=byte_size, help="bytes of one input image (default 16MiB)"
    )
    add_ray_arguments(parser)


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``modular serve --ray`` (those left ``None`` default as said, in ``serve_ray``)."""
    ray = parser.add_argument_group(
        "Ray Serve (--ray)",
        "The same API and page on Ray Serve's proxy, over worker replicas routed by what each holds (the\n"
        "extra ray). Jobs are kept in memory. Each replica offloads onto a simulated device of --budget,\n"
        "else onto its own GPU; --state, --offload, --margin, --host-budget and --threads do not apply.",
    )
    ray.add_argument(
        "--ray", action="store_true", help="serve on Ray Serve (default: a local Ray cluster of this machine)"
    )
    ray.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="join a running Ray cluster (auto: the one `ray start` made on this machine; HOST:6379)",
    )
    count = ray.add_mutually_exclusive_group()
    count.add_argument("--replicas", metavar="N", type=positive_int, help="worker replicas (default 2)")
    count.add_argument(
        "--autoscale",
        metavar="MIN:MAX",
        type=replica_range,
        help="let Ray Serve scale the workers between MIN and MAX replicas (in place of --replicas)",
    )
    ray.add_argument(
        "--gpus-per-replica",
        metavar="F",
        type=gpu_share,
        help="GPUs each replica holds (default 1; 0 with --budget; 0.5: two replicas per GPU)",
    )
    ray.add_argument(
        "--cpus-per-replica", metavar="F", type=positive_number, help="CPUs each replica holds (default 1)"
    )
    ray.add_argument(
        "--imbalance",
        metavar="J",
        type=non_negative_number,
        help="job times by which a replica's expected wait may exceed the shortest and the replica still be "
        "chosen for the models it holds (default 1)",
    )
    ray.add_argument(
        "--stats-period",
        metavar="S",
        type=positive_number,
        help="seconds between two reports of what a replica holds (default 1)",
    )
    ray.add_argument(
        "--tries",
        metavar="N",
        type=positive_int,
        help="tries of one job on the replicas before it fails (default 3)",
    )
