"""Batch jobs: many images from a job file, resumable after a crash, data-parallel over processes and nodes.

``load_job(path)`` reads and checks a job file; ``plan_batch`` says what would run; ``run_batch`` runs it
on this rank (under ``torchrun`` or ``accelerate launch`` every rank runs its share). See docs/batch.md.
"""

from .entries import BatchEntry, BatchJob, derive_seed, load_job
from .jobfile import JobFileError, JobSpec, Prompt, WorkflowSpec
from .ranks import RankGroup, RankInfo, split_entries
from .runner import BatchOptions, BatchPlan, BatchResult, check_batch, plan_batch, run_batch
from .store import OutputStore

__all__ = [
    "BatchEntry",
    "BatchJob",
    "BatchOptions",
    "BatchPlan",
    "BatchResult",
    "JobFileError",
    "JobSpec",
    "OutputStore",
    "Prompt",
    "RankGroup",
    "RankInfo",
    "WorkflowSpec",
    "check_batch",
    "derive_seed",
    "load_job",
    "plan_batch",
    "run_batch",
    "split_entries",
]
