"""A batch job file: what to generate, read from JSON (or TOML where Python has ``tomllib``) and checked whole.

The file lists the prompts once and the workflows to run them through (each a table with the keys of
one ``modular run`` job: ``repo``, ``workflow``, ``steps``, ``dtype``...); every prompt goes through every
workflow, at every size, ``images_per_prompt`` times. Relative paths (``output``, ``prompt_file``, a
local ``repo``, ``images``) are read from the job file's folder, so a job resumes from any directory.
Every problem in the file is collected into one ``JobFileError``, raised before anything is loaded.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from modular.batch.schema import COUNT_KEYS, PROMPT_KEYS, SHARED, TOP, WORKFLOW, got

__all__ = [
    "DEFAULT_OUTPUT_NAME",
    "JobFileError",
    "JobSpec",
    "Prompt",
    "WorkflowSpec",
    "parse_job",
    "read_job_file",
]

DEFAULT_OUTPUT_NAME = "{workflow}-{prompt_name}-{size}-{image}"
BOTH_COUNTS = "give 'seeds' (explicit seeds) or 'images_per_prompt' (derived seeds), not both"


class JobFileError(ValueError):
    """A job file that cannot run; the message (one line) names the file and every problem found."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"{source}: {self.problems[0]}"
        else:
            message = f"{source}: {len(self.problems)} problems: " + "; ".join(self.problems)
        super().__init__(message)


@attrs.frozen
class Prompt:
    """One prompt of the job: its text, an optional negative prompt, and the name outputs use."""

    text: str
    negative: str | None = None
    name: str | None = None


def _frozen_map(values: Mapping[str, Any]) -> dict[str, Any]:
    return dict(values)


@attrs.frozen
class WorkflowSpec:
    """One table of ``workflows``: a repo's pipeline (pruned to ``workflow``) and how to call it.

    ``repo`` and ``images`` are as written in the job file (they go into each output's sidecar);
    ``repo_path`` and ``image_paths`` are where they were found; ``image_sha256`` the sha256 of each image
    file's bytes when the job was read (``None`` for a missing file), so that an output made from an image
    that changed since is made again.
    """

    name: str
    repo: str
    repo_path: str
    workflow: str | None = None
    revision: str | None = None
    variant: str | None = None
    dtype: str = "auto"
    steps: int | None = None
    sizes: tuple[tuple[int, int] | None, ...] = (None,)
    images_per_prompt: int = 1
    seeds: tuple[int, ...] | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    inputs: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_map)
    images: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)
    image_paths: Mapping[str, Path] = attrs.field(factory=dict, converter=_frozen_map)
    image_sha256: Mapping[str, str | None] = attrs.field(factory=dict, converter=_frozen_map)


def _file_sha256(path: Path) -> str | None:
    """The sha256 of a file's bytes, or ``None`` when it is not a file (``check_batch`` names it then)."""
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@attrs.frozen
class JobSpec:
    """A checked job file: the output folder, the job seed, the prompts and the workflows."""

    source: str
    output: Path
    seed: int
    prompts: tuple[Prompt, ...]
    workflows: tuple[WorkflowSpec, ...]
    output_name: str = DEFAULT_OUTPUT_NAME
    format: str = "png"


def _unknown_key(key: str, valid: Mapping[str, Any] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (valid keys: {', '.join(sorted(valid))})"
    return f"unknown key {key!r}{hint}"


def _checked(
    table: Mapping[str, Any], schema: Mapping[str, Callable[[Any], Any]], where: str, problems: list[str]
) -> dict[str, Any]:
    """The table's known keys in normal form; each unknown key or bad value adds a problem."""
    values = {}
    for key, value in table.items():
        if key not in schema:
            problems.append(f"{where}{_unknown_key(key, schema)}")
            continue
        try:
            values[key] = schema[key](value)
        except ValueError as error:
            problems.append(f"{where}{key!r} {error}")
    return values


def _prompt(value: Any, where: str, problems: list[str]) -> Prompt | None:
    if isinstance(value, str):
        return Prompt(value)
    if not isinstance(value, dict):
        problems.append(f"{where}a prompt must be a string or a table with 'prompt' {got(value)}")
        return None
    unknown = [key for key in value if key not in PROMPT_KEYS]
    problems.extend(f"{where}{_unknown_key(key, PROMPT_KEYS)}" for key in unknown)
    text, negative, name = (value.get(key) for key in PROMPT_KEYS)
    if not isinstance(text, str):
        problems.append(f"{where}'prompt' must be a string {got(text)}")
        return None
    for key, item in (("negative_prompt", negative), ("name", name)):
        if item is not None and not isinstance(item, str):
            problems.append(f"{where}{key!r} must be a string {got(item)}")
            return None
    return None if unknown else Prompt(text, negative, name)


def _prompt_file(path: Path, written: str, source: str) -> list[tuple[str, Any]]:
    """``(where, value)`` per prompt of a ``.txt`` (one per non-blank line) or ``.jsonl`` file."""
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        msg = f"{source}: prompt_file {written!r} {what} (looked for {path})"
        raise FileNotFoundError(msg)
    lines = [(number, line) for number, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    if path.suffix == ".txt":
        return [(f"{written} line {number}: ", line.strip()) for number, line in lines]
    if path.suffix != ".jsonl":
        raise JobFileError(
            source, [f"prompt_file must end in .txt (a prompt a line) or .jsonl (got {written!r})"]
        )
    values = []
    for number, line in lines:
        try:
            values.append((f"{written} line {number}: ", json.loads(line)))
        except json.JSONDecodeError as error:
            values.append((f"{written} line {number}: ", _BadLine(error.msg)))
    return values


@attrs.frozen
class _BadLine:
    reason: str


def _prompts(top: Mapping[str, Any], base: Path, source: str, problems: list[str]) -> tuple[Prompt, ...]:
    if ("prompts" in top) == ("prompt_file" in top):
        problems.append("give the prompts once: 'prompts' (a list) or 'prompt_file' (a .txt or .jsonl file)")
        return ()
    if "prompts" in top:
        if not isinstance(top["prompts"], list):
            problems.append(f"'prompts' must be a list of strings or tables {got(top['prompts'])}")
            return ()
        raw = [(f"prompts[{number}]: ", value) for number, value in enumerate(top["prompts"])]
    elif not isinstance(top["prompt_file"], str) or not top["prompt_file"]:
        return ()  # its problem is recorded with the other keys'
    else:
        written = top["prompt_file"]
        raw = _prompt_file(base / written, written, source)
    prompts = []
    for where, value in raw:
        if isinstance(value, _BadLine):
            problems.append(f"{where}not JSON ({value.reason})")
            continue
        prompt = _prompt(value, where, problems)
        if prompt is not None:
            prompts.append(prompt)
    if not raw:
        problems.append("the job has no prompts")
    return tuple(prompts)


def _local(base: Path, written: str) -> str:
    """A local folder relative to the job file when there is one, else the text as given (a hub id)."""
    path = Path(written).expanduser()
    candidate = path if path.is_absolute() else base / path
    return str(candidate.resolve()) if candidate.exists() else written


def _workflow(
    table: Any, number: int, top: Mapping[str, Any], base: Path, problems: list[str]
) -> WorkflowSpec | None:
    where = f"workflows[{number}]: "
    if not isinstance(table, dict):
        problems.append(f"{where}must be a table with at least 'repo' {got(table)}")
        return None
    values = _checked(table, WORKFLOW, where, problems)
    if "repo" not in table:
        problems.append(f"{where}'repo' is missing (a local folder or a hub repo id)")
        return None
    if "repo" not in values:
        return None
    own_count = COUNT_KEYS & values.keys()
    if len(own_count) == 2:
        problems.append(f"{where}{BOTH_COUNTS}")
    shared = {key: top[key] for key in SHARED if key in top}
    if own_count:  # a workflow's own count of images replaces the top level's, whichever key that used
        for key in COUNT_KEYS:
            shared.pop(key, None)
    settings = {**shared, **values}
    name = settings.pop("name", None) or settings.get("workflow") or Path(settings["repo"]).name
    images = settings.get("images", {})
    image_paths = {key: (base / path).resolve() for key, path in images.items()}
    return WorkflowSpec(
        name=name,
        repo_path=_local(base, settings["repo"]),
        image_paths=image_paths,
        image_sha256={key: _file_sha256(path) for key, path in image_paths.items()},
        **settings,
    )


def parse_job(data: Any, source: str, base: Path) -> JobSpec:
    """Check a job read from a file (or made in Python) and put it in normal form.

    Args:
        data: The job as read: a table with ``output``, ``workflows`` and ``prompts`` or ``prompt_file``.
        source: Names the job in messages (the file's path).
        base: The folder relative paths are read from (the job file's folder).

    Raises:
        JobFileError: unknown keys (the closest valid key named), values of the wrong kind, a missing
            required key, two workflows of one name; every problem found, in one message.
        FileNotFoundError: the prompt file does not exist.
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        raise JobFileError(source, [f"a job file holds one table of keys {got(data)}"])
    top = _checked(data, TOP, "", problems)
    if COUNT_KEYS <= top.keys():
        problems.append(BOTH_COUNTS)
    for key in ("output", "workflows"):
        if key not in data:
            problems.append(f"{key!r} is missing")
    prompts = _prompts(data, base, source, problems)
    workflows = data.get("workflows", [])
    if not isinstance(workflows, list) or ("workflows" in data and not workflows):
        problems.append(f"'workflows' must be a non-empty list of tables {got(workflows)}")
        workflows = []
    specs = [spec for n, table in enumerate(workflows) if (spec := _workflow(table, n, top, base, problems))]
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        problems.append(
            f"workflow names must be unique (got {twice} more than once); give each table a 'name'"
        )
    if problems:
        raise JobFileError(source, problems)
    output = Path(top["output"]).expanduser()
    return JobSpec(
        source=source,
        output=(output if output.is_absolute() else base / output).resolve(),
        seed=top.get("seed", 0),
        prompts=prompts,
        workflows=tuple(specs),
        output_name=top.get("output_name", DEFAULT_OUTPUT_NAME),
        format=top.get("format", "png"),
    )


def _toml(text: str, source: str) -> Any:
    if sys.version_info >= (3, 11):  # tomllib is new in 3.11; the type checker reads this as 3.10 code
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise JobFileError(source, [f"not TOML ({error})"]) from None
    raise JobFileError(source, ["TOML job files need Python 3.11+ (tomllib); write the job as JSON"])


def read_job_file(path: str | Path) -> JobSpec:
    """Read and check a job file: ``.json``, or ``.toml`` on Python 3.11+ (``tomllib``).

    Raises:
        FileNotFoundError: no such file. JobFileError: a file that is not JSON/TOML, or a bad job.
    """
    file = Path(path)
    if not file.is_file():
        what = "is a folder, not a job file" if file.is_dir() else "does not exist"
        msg = f"job file {str(path)!r} {what}"
        raise FileNotFoundError(msg)
    text = file.read_text()
    if file.suffix == ".toml":
        data = _toml(text, str(path))
    elif file.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise JobFileError(str(path), [f"not JSON ({error})"]) from None
    else:
        raise JobFileError(
            str(path), [f"a job file ends in .json or .toml (got {file.suffix or 'no suffix'!r})"]
        )
    return parse_job(data, str(path), file.resolve().parent)
