"""A batch job's entries: one image each, a deterministic function of the entry alone.

Entries are numbered prompt by prompt: for each prompt (in file order), each workflow (in file order),
each size, each image. An entry's seed is ``derive_seed(job seed, entry index)`` (or the listed seed
when the workflow gives ``seeds``), so which rank runs it, and when, never changes its image; prompts
appended to the file add entries at the end and leave every earlier entry's index, seed and output as
they were.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from modular.batch.jobfile import JobFileError, JobSpec, Prompt, WorkflowSpec, parse_job, read_job_file
from modular.batch.jobs import Job

__all__ = ["NAME_FIELDS", "BatchEntry", "BatchJob", "derive_seed", "load_job", "torch_dtype"]

NAME_FIELDS = ("index", "workflow", "prompt_index", "prompt_name", "size", "width", "height", "image", "seed")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def derive_seed(job_seed: int, index: int) -> int:
    """The seed of entry ``index``: the first 8 bytes of ``sha256(f"{job_seed}:{index}")``, big-endian,
    shifted right by one bit (a 63-bit seed that any generator takes).

    Example:
        >>> derive_seed(0, 0)
        6213027144842677344
    """
    digest = hashlib.sha256(f"{job_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def torch_dtype(name: str, on_cuda: bool) -> torch.dtype:
    """The weights dtype of a workflow's ``dtype``: ``auto`` is bfloat16 on CUDA, else float32."""
    if name == "auto":
        return torch.bfloat16 if on_cuda else torch.float32
    return _DTYPES[name]


@attrs.frozen
class BatchEntry:
    """One image of a batch job.

    Attributes:
        index: Position in the job's entries (see the module docstring for the order).
        name: The output's file name without its suffix; unique within the job.
        workflow: The workflow table it runs.
        prompt: Its prompt; ``prompt_index`` its position in the job's prompts.
        size: ``(width, height)``, or ``None`` for the pipeline's default size.
        image: Its number among the prompt's images in this workflow and size.
        seed: Seed of the CPU generator it runs with.
    """

    index: int
    name: str
    workflow: WorkflowSpec
    prompt: Prompt
    prompt_index: int
    size: tuple[int, int] | None
    image: int
    seed: int

    @property
    def negative_prompt(self) -> str | None:
        return self.prompt.negative if self.prompt.negative is not None else self.workflow.negative_prompt

    def inputs(self) -> dict[str, Any]:
        """Call inputs, except images read from files and the generator."""
        values: dict[str, Any] = {"prompt": self.prompt.text}
        for key, value in (
            ("negative_prompt", self.negative_prompt),
            ("num_inference_steps", self.workflow.steps),
            ("guidance_scale", self.workflow.guidance_scale),
        ):
            if value is not None:
                values[key] = value
        if self.size is not None:
            values["width"], values["height"] = self.size
        return {**values, **self.workflow.inputs}

    def job(self, images: Mapping[str, Any], on_cuda: bool) -> Job:
        """This entry as one job of ``modular run`` (``modular.batch.jobs.Job``), with its images read."""
        spec = self.workflow
        load: dict[str, Any] = {"torch_dtype": torch_dtype(spec.dtype, on_cuda)}
        if spec.variant is not None:
            load["variant"] = spec.variant
        return Job(
            self.name,
            spec.repo_path,
            spec.workflow,
            {**self.inputs(), **images},
            self.seed,
            load_options=load,
            revision=spec.revision,
        )

    def describe(self) -> dict[str, Any]:
        """What makes this entry's image, as JSON values; a finished output's sidecar holds it, and an
        output is reused only while its sidecar's description equals the entry's."""
        spec = self.workflow
        described = {
            "index": self.index,
            "name": self.name,
            "workflow": spec.name,
            "repo": spec.repo,
            "pipeline_workflow": spec.workflow,
            "revision": spec.revision,
            "variant": spec.variant,
            "dtype": spec.dtype,
            "prompt": self.prompt.text,
            "negative_prompt": self.negative_prompt,
            "seed": self.seed,
            "steps": spec.steps,
            "size": None if self.size is None else list(self.size),
            "guidance_scale": spec.guidance_scale,
            "inputs": dict(spec.inputs),
            "images": dict(spec.images),
        }
        if spec.image_sha256:  # the input images' content, not only their paths (only where there are any)
            described["image_sha256"] = dict(spec.image_sha256)
        return described


def _fields(index: int, spec: WorkflowSpec, prompt: Prompt, number: int, size: Any, image: int, seed: int):
    width, height = size if size is not None else ("default", "default")
    return {
        "index": index,
        "workflow": spec.name,
        "prompt_index": number,
        "prompt_name": prompt.name if prompt.name is not None else f"p{number:05d}",
        "size": "default" if size is None else f"{width}x{height}",
        "width": width,
        "height": height,
        "image": image,
        "seed": seed,
    }


def _name(template: str, fields: dict[str, Any], source: str) -> str:
    try:
        text = template.format(**fields)
    except KeyError as error:
        field = str(error.args[0])
        close = difflib.get_close_matches(field, NAME_FIELDS, n=1)
        hint = f" (did you mean {{{close[0]}}}?)" if close else ""
        msg = f"'output_name' {template!r} has an unknown field {{{field}}}{hint}; fields: {', '.join(NAME_FIELDS)}"
        raise JobFileError(source, [msg]) from None
    except (ValueError, IndexError) as error:
        msg = f"'output_name' {template!r} is not a format string of named fields ({error})"
        raise JobFileError(source, [msg]) from None
    return _UNSAFE.sub("_", text).lstrip(".")


def _expand(spec: JobSpec) -> tuple[BatchEntry, ...]:
    entries: list[BatchEntry] = []
    for number, prompt in enumerate(spec.prompts):
        for workflow in spec.workflows:
            count = len(workflow.seeds) if workflow.seeds is not None else workflow.images_per_prompt
            for size in workflow.sizes:
                for image in range(count):
                    index = len(entries)
                    seed = (
                        workflow.seeds[image] if workflow.seeds is not None else derive_seed(spec.seed, index)
                    )
                    fields = _fields(index, workflow, prompt, number, size, image, seed)
                    name = _name(spec.output_name, fields, spec.source)
                    entries.append(BatchEntry(index, name, workflow, prompt, number, size, image, seed))
    return tuple(entries)


def _check_names(entries: tuple[BatchEntry, ...], spec: JobSpec) -> None:
    first: dict[str, int] = {}
    clashes: list[tuple[int, int, str]] = []
    for entry in entries:
        if not entry.name:
            msg = f"'output_name' {spec.output_name!r} makes an empty file name for entry {entry.index}"
            raise JobFileError(spec.source, [msg])
        if entry.name in first:
            clashes.append((first[entry.name], entry.index, entry.name))
        first.setdefault(entry.name, entry.index)
    if clashes:
        a, b, name = clashes[0]
        more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
        msg = (
            f"entries {a} and {b} both write '{name}.{spec.format}'{more}; make 'output_name' "
            f"({spec.output_name!r}) tell them apart, e.g. add {{index}}, or give the prompts distinct names"
        )
        raise JobFileError(spec.source, [msg])


@attrs.frozen
class BatchJob:
    """A checked job (``spec``) and its entries, in index order."""

    spec: JobSpec
    entries: tuple[BatchEntry, ...]

    @classmethod
    def from_spec(cls, spec: JobSpec) -> BatchJob:
        """Expand the spec into entries; two entries writing one file name is a ``JobFileError``."""
        entries = _expand(spec)
        _check_names(entries, spec)
        return cls(spec, entries)

    @property
    def output(self) -> Path:
        return self.spec.output

    def __len__(self) -> int:
        return len(self.entries)


def load_job(job: str | Path | Mapping[str, Any], base: str | Path | None = None) -> BatchJob:
    """A batch job from a job file's path, or from a table made in Python (paths relative to ``base``,
    default the current folder). Nothing is loaded and no file is written.

    Raises:
        JobFileError: anything wrong with the job (unknown keys, bad values, clashing output names).
        FileNotFoundError: the job file or its prompt file does not exist.
    """
    if isinstance(job, Mapping):
        spec = parse_job(dict(job), "job", Path(base or ".").resolve())
    else:
        spec = read_job_file(job)
    return BatchJob.from_spec(spec)
