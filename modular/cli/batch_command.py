"""``modular batch JOB``: a job file's images, resumable, on every process a launcher starts.

Run it directly for one process, or under ``torchrun --nproc-per-node N`` / ``accelerate launch`` for N
(``python -m torch.distributed.run ... -m modular batch JOB``); see docs/batch.md. ``--dry-run`` prints
each rank's entries and the components each workflow loads, reading index files only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from modular.batch import BatchOptions, RankInfo, load_job, plan_batch, run_batch
from modular.batch.runner import redo_lines
from modular.cli.args import BATCH_DESCRIPTION, add_batch_arguments

__all__ = ["BATCH_DESCRIPTION", "add_batch_arguments", "batch_command"]

_SHOWN = 20  # entries listed per rank by --dry-run


def _dry_run(args: argparse.Namespace, out: Callable[[str], Any]) -> int:
    info = RankInfo.from_env()
    job = load_job(args.job)
    plan = plan_batch(job, args.ranks or info.world_size)
    if info.rank != 0:  # under a launcher, rank 0 speaks for every rank
        return 0
    spec = job.spec
    out(
        f"{spec.source}: {len(job)} entries ({len(plan.finished)} done earlier, {len(plan.pending)} to run), "
        f"job seed {spec.seed}, {spec.format} files in {spec.output}"
    )
    for line in redo_lines(job, plan.redo):
        out(line)
    seen: dict[str, str] = {}
    for workflow in spec.workflows:
        count = sum(1 for entry in job.entries if entry.workflow.name == workflow.name)
        pruned = f", workflow {workflow.workflow}" if workflow.workflow else ""
        out(
            f"workflow {workflow.name}: {workflow.repo}{pruned}, {count} entries; loads on each rank that runs it:"
        )
        for name, kind, load_id in plan.components[workflow.name]:
            shared = f" (the same as {seen[load_id]}'s: loaded once)" if load_id in seen else ""
            seen.setdefault(load_id, workflow.name)
            out(f"  {name}: {kind}  load_id={load_id}{shared}")
    for rank, share in enumerate(plan.shares):
        out(f"rank {rank} of {len(plan.shares)}: {len(share)} entries")
        for entry in share[:_SHOWN]:
            out(f"  {entry.index}  {entry.name}  seed {entry.seed}  {entry.prompt.text!r}")
        if len(share) > _SHOWN:
            out(f"  ... and {len(share) - _SHOWN} more")
    out("dry run: no weights loaded, nothing written")
    return 0


def batch_command(args: argparse.Namespace, out: Callable[[str], Any] = print) -> int:
    """Run (or with ``--dry-run`` describe) the job file ``args.job``; returns the exit status."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.dry_run:
        return _dry_run(args, out)
    if args.ranks is not None:
        msg = "--ranks previews a split with --dry-run; to run on N processes, launch with torchrun --nproc-per-node N"
        raise ValueError(msg)
    options = BatchOptions(
        offload=args.offload, budget=args.budget, margin=args.margin, progress=False if args.quiet else None
    )
    run_batch(load_job(args.job), options, report=out)
    return 0
