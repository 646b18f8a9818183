"""What a server serves: its workflows, each a repo's pipeline, named once when the server starts.

A request can only name one of these (never a hub id, a local path or remote code of its own). Each
served workflow's pipeline is made at start-up (index files read, no weights) so that requests are checked
against its inputs at once; its components load through the one manager on its first job, so components
shared across repos (the same load ID) load once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from components import ComponentsManager
from modular.batch.entries import torch_dtype
from modular.batch.jobs import Job, JobRunner
from modular.batch.schema import DTYPES
from modular.pipeline.pipeline import ModularPipeline

__all__ = ["ServedWorkflow", "ServedWorkflows", "parse_served"]


@attrs.frozen
class ServedWorkflow:
    """One workflow a server runs: ``name`` (what requests say), the repo (a local folder or hub id, as
    the server was started with it), the family's named ``workflow`` to prune to (``None``: the whole
    pipeline, whose auto blocks choose by the inputs given), and how its weights load."""

    name: str
    repo: str
    workflow: str | None = None
    revision: str | None = None
    variant: str | None = None
    dtype: str = "auto"

    def table(self) -> dict[str, Any]:
        """This workflow as a ``workflows`` table of the batch job format (the keys it sets)."""
        values = {"name": self.name, "repo": self.repo, "dtype": self.dtype}
        for key in ("workflow", "revision", "variant"):
            if getattr(self, key) is not None:
                values[key] = getattr(self, key)
        return values


def parse_served(text: str, dtype: str = "auto") -> ServedWorkflow:
    """A served workflow from the command line: ``REPO``, ``REPO:WORKFLOW`` or ``NAME=REPO[:WORKFLOW]``.

    Without ``NAME=`` the name is the repo's last folder (``tiny-sd``), with ``:WORKFLOW`` after it
    (``tiny-sd:image2image``).

    Raises:
        ValueError: an empty part, or a ``dtype`` the batch format does not know.
    """
    if dtype not in DTYPES:
        msg = f"dtype must be one of {list(DTYPES)} (got {dtype!r})"
        raise ValueError(msg)
    name, _, rest = text.rpartition("=") if "=" in text else ("", "", text)
    repo, _, workflow = rest.partition(":")
    if not repo or (":" in rest and not workflow) or ("=" in text and not name):
        msg = f"a served workflow is REPO, REPO:WORKFLOW or NAME=REPO[:WORKFLOW] (got {text!r})"
        raise ValueError(msg)
    if not name:
        name = Path(repo.rstrip("/")).name + (f":{workflow}" if workflow else "")
    return ServedWorkflow(name=name, repo=repo, workflow=workflow or None, dtype=dtype)


class ServedWorkflows(Mapping[str, ServedWorkflow]):
    """The workflows of one server, their pipelines bound on one manager and loaded on first use.

    Args:
        workflows: What to serve; names must be unique.
        manager: The manager every pipeline loads through.
        base: The folder a relative local repo is read from (the server's working folder).

    Raises:
        ValueError: two workflows share a name, or none is given.
        FileNotFoundError, JobFileError and the input errors of ``JobRunner.bind``: a repo that cannot be read.
    """

    def __init__(
        self, workflows: Sequence[ServedWorkflow], manager: ComponentsManager, base: str | Path = "."
    ) -> None:
        if not workflows:
            raise ValueError("serve at least one repo or workflow")
        names = [served.name for served in workflows]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            msg = f"served workflow names must be unique (got {twice} more than once); give each NAME=REPO"
            raise ValueError(msg)
        self.manager = manager
        self.base = Path(base).resolve()
        self._served = {served.name: served for served in workflows}
        self._runner = JobRunner(manager, progress=False)
        self._pipes = {served.name: self._bind(served) for served in workflows}
        self._loaded: set[str] = set()
        self._lock = threading.Lock()

    def _bind_job(self, served: ServedWorkflow) -> Job:
        return Job(served.name, self.repo_path(served), served.workflow, revision=served.revision)

    def _bind(self, served: ServedWorkflow) -> ModularPipeline:
        # Only the index is read, and no inputs are checked: a workflow that requires an input (an image to
        # image workflow's image) is served, and each request's inputs are checked on their own.
        job = self._bind_job(served)
        return ModularPipeline.from_pretrained(
            job.repo,
            components_manager=self.manager,
            collection=job.name,
            workflow=job.workflow,
            revision=job.revision,
        )

    def repo_path(self, served: ServedWorkflow) -> str:
        """Where the repo is found: a local folder (relative to ``base``) when there is one, else the hub id."""
        path = Path(served.repo).expanduser()
        candidate = path if path.is_absolute() else self.base / path
        return str(candidate.resolve()) if candidate.exists() else served.repo

    def __getitem__(self, name: str) -> ServedWorkflow:
        return self._served[name]

    def __iter__(self):
        return iter(self._served)

    def __len__(self) -> int:
        return len(self._served)

    def pipeline(self, name: str) -> ModularPipeline:
        """The bound pipeline of ``name`` (its weights may not be loaded yet)."""
        return self._pipes[name]

    def is_loaded(self, name: str) -> bool:
        return name in self._loaded

    def load(self, name: str, on_cuda: bool = False) -> ModularPipeline:
        """``name``'s pipeline with its components loaded (through the manager: shared ones once)."""
        with self._lock:
            pipe = self._pipes[name]
            if name not in self._loaded:
                served = self._served[name]
                load: dict[str, Any] = {"torch_dtype": torch_dtype(served.dtype, on_cuda)}
                if served.variant is not None:
                    load["variant"] = served.variant
                job = attrs.evolve(self._bind_job(served), load_options=load)
                self._runner.load(job, pipe)
                pipe.set_progress_bar_config(disable=True)
                self._loaded.add(name)
            return pipe

    def describe(self, name: str) -> dict[str, Any]:
        """``name`` for a client: its repo, workflow, and each input of its pipeline with its type and default."""
        served = self._served[name]
        pipe = self._pipes[name]
        inputs = []
        for param in pipe.blocks.inputs:
            if not param.name:
                continue
            inputs.append(
                {
                    "name": param.name,
                    "type": _type_name(param.type_hint),
                    "required": bool(param.required and param.default is None),
                    "default": _json_value(param.default),
                    "description": param.description or "",
                }
            )
        return {**served.table(), "family": type(pipe.blocks).__name__, "inputs": inputs}


def _type_name(hint: Any) -> str:
    if hint is None:
        return "any"
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _json_value(value: Any) -> Any:
    """A default as JSON can carry it; others (a tensor, a generator) as their type's name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(item, (bool, int, float, str)) for item in value):
        return list(value)
    return f"<{type(value).__name__}>"
