"""Jobs: one pipeline run as ``modular run`` makes it (``jobs.py``), and batches of them from a job file,
resumable after a crash, data-parallel over processes and nodes. May import `modular.pipeline` and below.

``load_job(path)`` reads and checks a job file; ``plan_batch`` says what would run; ``run_batch`` runs it
on this rank (under ``torchrun`` or ``accelerate launch`` every rank runs its share). See docs/batch.md.
"""

from typing import TYPE_CHECKING

from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from modular.batch.entries import BatchEntry, BatchJob, derive_seed, load_job
    from modular.batch.jobfile import JobFileError, JobSpec, Prompt, WorkflowSpec
    from modular.batch.ranks import RankGroup, RankInfo, split_entries
    from modular.batch.runner import BatchOptions, BatchPlan, BatchResult, check_batch, plan_batch, run_batch
    from modular.batch.store import OutputStore

# Each name is imported on first use (PEP 562): `modular --help` reads job values without the runner.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

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
