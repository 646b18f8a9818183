"""Jobs: one pipeline run as ``modular run`` makes it (``jobs.py``), and batches of them from a job file,
resumable after a crash, data-parallel over processes and nodes. May import `modular.pipeline` and below.

``load_job(path)`` reads and checks a job file; ``plan_batch`` says what would run; ``run_batch`` runs it
on this rank (under ``torchrun`` or ``accelerate launch`` every rank runs its share). See docs/batch.md.
"""

from modular.batch.entries import BatchEntry, BatchJob, derive_seed, load_job
from modular.batch.jobfile import JobFileError, JobSpec, Prompt, WorkflowSpec
from modular.batch.ranks import RankGroup, RankInfo, split_entries
from modular.batch.runner import BatchOptions, BatchPlan, BatchResult, check_batch, plan_batch, run_batch
from modular.batch.store import OutputStore

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
