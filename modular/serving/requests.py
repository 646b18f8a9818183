"""A job request, as a client sends it: one prompt through one served workflow, checked by the batch job check.

A request is the batch job format narrowed to one prompt, one workflow and one size (docs/serving.md):
``{"workflow": "tiny-sd", "prompt": "a red fox", "seed": 7, "size": "64x64", "steps": 20}``. It becomes a
one-prompt job table and goes through ``parse_job`` and ``BatchJob.from_spec`` (the same checks and the same
messages as ``modular batch``), then its inputs are checked against the workflow's pipeline as ``modular
run`` checks them. Its images (``images_per_prompt`` of them) are its entries; each entry's seed is the
batch format's (``derive_seed(seed, index)``, or the listed ``seeds``). Limits (steps, images, pixels) are
checked before anything is accepted.
"""

from __future__ import annotations

import difflib
import random
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import PIL.Image

from modular.batch.entries import BatchEntry, BatchJob
from modular.batch.jobfile import JobFileError, parse_job
from modular.batch.jobs import MAX_SEED, check_job_inputs, seed_problem
from modular.batch.schema import SHARED, WORKFLOW, got
from modular.serving.served import ServedWorkflows

__all__ = [
    "REQUEST_KEYS",
    "CheckedRequest",
    "Limits",
    "RequestError",
    "check_request",
    "open_images",
    "seeds_of",
]

SOURCE = "request"
PRIORITY_BOUND = 2**63  # a priority is stored with its job, as SQLite's 64-bit INTEGER
# Keys of a request beyond the batch keys it passes on: which workflow, the prompt, one size, and how it queues.
OWN_KEYS = ("workflow", "prompt", "negative_prompt", "size", "priority", "timeout", "seed")
PASSED_ON = ("steps", "guidance_scale", "images_per_prompt", "seeds", "inputs")
REQUEST_KEYS = (*OWN_KEYS, *PASSED_ON, "images")
# Keys that would choose what loads (a repo, its files, remote code): a request names a served workflow instead.
SOURCE_KEYS = frozenset(
    {
        "repo",
        "revision",
        "variant",
        "dtype",
        "subfolder",
        "trust_remote_code",
        "custom_pipeline",
        "pretrained_model_name_or_path",
        "model",
        "path",
        "workflows",
        "load_options",
    }
)


class RequestError(JobFileError):
    """A request the server refuses; the message (one line) names every problem, as ``modular batch`` does."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(SOURCE, problems)


def _at_least_one(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{attribute.name} must be a whole number of at least 1 (got {value!r})"
        raise ValueError(msg)


@attrs.frozen
class Limits:
    """What one request may ask for: ``max_steps`` per image, ``max_images`` per request, ``max_pixels``
    per image (width times height, asked for or given as an input image).

    Raises:
        ValueError: a limit that is not a whole number of at least 1 (found at start, not at a request).
    """

    max_steps: int = attrs.field(default=200, validator=_at_least_one)
    max_images: int = attrs.field(default=8, validator=_at_least_one)
    max_pixels: int = attrs.field(default=2048 * 2048, validator=_at_least_one)

    def problems(self, job: BatchJob) -> list[str]:
        found = []
        spec = job.spec.workflows[0]
        if spec.steps is not None and spec.steps > self.max_steps:
            found.append(f"'steps' must be at most {self.max_steps} on this server (got {spec.steps})")
        for size in spec.sizes:
            if size is not None and size[0] * size[1] > self.max_pixels:
                found.append(
                    f"'size' {size[0]}x{size[1]} is {size[0] * size[1]} pixels; this server makes at most {self.max_pixels}"
                )
        return found


@attrs.frozen
class CheckedRequest:
    """An accepted request in normal form: ``data`` is what is stored (and checked again after a restart),
    ``job`` its one-prompt batch job, ``entries`` its images in order."""

    data: Mapping[str, Any]
    workflow: str
    job: BatchJob
    priority: int
    timeout: float | None

    @property
    def entries(self) -> tuple[BatchEntry, ...]:
        return self.job.entries


def limits_of(limits: Limits | None) -> Limits:
    return limits if limits is not None else Limits()


def _too_many(limits: Limits, count: int) -> str:
    return f"a request makes at most {limits.max_images} images on this server (got {count})"


# The batch keys a message names, as a request names them (a request has one size, one prompt, PNG results).
_REQUEST_WORDING = (
    ("workflows[0]: ", ""),
    ("'sizes' must be a list of sizes", "'size' must be a size"),
    ("through its key 'sizes'", "through its key 'size'"),
    ("through its key 'prompts'", "through its key 'prompt'"),
    ("which the job sets through its key 'format'; use that key", "which the server sets (results are PNG)"),
)


def _said_of_request(problem: str) -> str:
    """A problem of the batch check said of the request rather than of its job table."""
    for batch, request in _REQUEST_WORDING:
        problem = problem.replace(batch, request)
    return problem


def _unknown(key: str, served: ServedWorkflows) -> str:
    if key in SOURCE_KEYS:
        return (
            f"a request cannot set {key!r}: it names one of the workflows this server was started with as "
            f"'workflow' ({', '.join(sorted(served))})"
        )
    close = difflib.get_close_matches(key, REQUEST_KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (valid keys: {', '.join(sorted(REQUEST_KEYS))})"
    return f"unknown key {key!r}{hint}"


def _number(data: Mapping[str, Any], key: str, problems: list[str], whole: bool) -> Any:
    value = data.get(key)
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        problems.append(f"{key!r} must be a {'whole number' if whole else 'number'} {got(value)}")
        return None
    return value


def _workflow(data: Mapping[str, Any], served: ServedWorkflows, problems: list[str]) -> str | None:
    name = data.get("workflow")
    if name is None and len(served) == 1:
        return next(iter(served))
    if not isinstance(name, str) or name not in served:
        what = "is missing" if name is None else f"{name!r} is not served here"
        problems.append(f"'workflow' {what}; this server serves {', '.join(sorted(served))}")
        return None
    return name


def check_request(
    data: Any,
    served: ServedWorkflows,
    images: Mapping[str, Path] | None = None,
    limits: Limits | None = None,
    output: str | Path = "results",
) -> CheckedRequest:
    """Check one request; returns it in normal form (a seed chosen when none is given).

    Args:
        data: The request as JSON values.
        served: What the server serves; the request names one of them.
        images: Input images the server stored for the request (uploads or decoded base64), by input
            name, at paths the server made.
        limits: What one request may ask for (default ``Limits()``).
        output: The folder results go to (only its name is checked; the server writes there itself).

    Raises:
        RequestError: anything wrong, every problem in one message, with the messages of ``modular batch``.
        MissingInputError, UnknownInputError, InputTypeError: inputs the workflow's pipeline does not take.
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        raise RequestError([f"a request is one table of keys {got(data)}"])
    images = dict(images or {})
    problems.extend(_unknown(key, served) for key in data if key not in REQUEST_KEYS)
    if "images" in data:
        problems.append("'images' come as uploads or base64 inputs, which the server stores itself")
    workflow = _workflow(data, served, problems)
    priority = _number(data, "priority", problems, whole=True) or 0
    if not -PRIORITY_BOUND <= priority < PRIORITY_BOUND:
        problems.append(f"'priority' must be from -2**63 to 2**63-1 (got {priority})")
    timeout = _number(data, "timeout", problems, whole=False)
    if timeout is not None and not 0 < timeout <= threading.TIMEOUT_MAX:  # NaN included
        problems.append(
            f"'timeout' must be more than 0 and at most {threading.TIMEOUT_MAX:.0f} seconds (got {timeout})"
        )
    count = data.get("images_per_prompt")
    if isinstance(count, int) and not isinstance(count, bool) and count > limits_of(limits).max_images:
        # before the batch check, which would make every one of its entries first
        problems.append(
            f"a request makes at most {limits_of(limits).max_images} images on this server (got {count})"
        )
    prompt = data.get("prompt")
    if not isinstance(prompt, str):
        problems.append(f"'prompt' must be a string {got(prompt)}")
    size = data.get("size")
    if problems or workflow is None or not isinstance(prompt, str):
        raise RequestError(problems)
    normal = dict(data)
    normal["workflow"] = workflow
    if "seeds" not in normal:
        seed = normal.get("seed")
        if seed is None:
            normal["seed"] = seed = random.randrange(MAX_SEED + 1)  # recorded: a restart runs the same images
        problem = seed_problem(seed)
        if problem is not None:
            raise RequestError([f"'seed' {problem}"])
    elif "seed" in normal:
        raise RequestError(
            ["give 'seed' (image i is made with seed + i) or 'seeds' (one per image), not both"]
        )
    shared = {key: normal[key] for key in PASSED_ON if key in normal and key != "inputs"}
    count = shared.get("images_per_prompt")
    if isinstance(count, int) and not isinstance(count, bool) and count > limits_of(limits).max_images:
        # Refused before the batch job is made: it would make every entry first (a huge count never ends).
        raise RequestError([_too_many(limits_of(limits), count)])
    if "seed" in normal:  # the seeds of the job's entries, as the batch format lists explicit ones
        count = shared.pop("images_per_prompt", 1)
        if (
            isinstance(count, int)
            and not isinstance(count, bool)
            and 1 <= count <= limits_of(limits).max_images
        ):
            shared["seeds"] = seeds_of({"seed": normal["seed"], "images_per_prompt": count})
        else:
            shared["images_per_prompt"] = (
                count  # refused below, with the batch format's message or the limit's
            )
    workflow_table = dict(served[workflow].table())
    if "inputs" in normal:
        workflow_table["inputs"] = normal["inputs"]
    if images:
        workflow_table["images"] = {key: str(path) for key, path in images.items()}
    prompt_table = {"prompt": prompt}
    if "negative_prompt" in data:
        prompt_table["negative_prompt"] = data["negative_prompt"]
    table: dict[str, Any] = {
        "output": str(output),
        "prompts": [prompt_table],
        "workflows": [workflow_table],
        **shared,
    }
    if size is not None:
        table["sizes"] = [size]
    try:
        job = BatchJob.from_spec(parse_job(table, SOURCE, served.base))
    except JobFileError as error:  # the batch check's messages, said of the request rather than of its table
        raise RequestError([_said_of_request(problem) for problem in error.problems]) from None
    if len(job.entries) > limits_of(limits).max_images:
        raise RequestError([_too_many(limits_of(limits), len(job.entries))])
    limits = limits or Limits()
    opened = open_images(images, limits.max_pixels)
    problems = limits.problems(job)
    if problems:
        raise RequestError(problems)
    entry = job.entries[0]
    pipe = served.pipeline(workflow)
    # Named as the server was started with it (as `modular run REPO` names it): a client never learns the
    # server's folders from a message.
    named = attrs.evolve(entry.job(opened, on_cuda=False), repo=served[workflow].repo)
    check_job_inputs(pipe, named, {})
    return CheckedRequest(normal, workflow, job, priority, timeout)


def seeds_of(request: Mapping[str, Any]) -> list[int]:
    """The seed of each image of a request in normal form: its ``seeds``, else ``seed``, ``seed + 1``, ...
    (``images_per_prompt`` of them, wrapping past the largest seed)."""
    if "seeds" in request:
        return list(request["seeds"])
    return [
        (request["seed"] + number) % (MAX_SEED + 1) for number in range(request.get("images_per_prompt", 1))
    ]


def open_images(images: Mapping[str, Path], max_pixels: int | None = None) -> dict[str, PIL.Image.Image]:
    """The input images, decoded (a mask as one channel, others as RGB); the size in the file's header is
    checked against ``max_pixels`` before any pixel is decoded.

    Raises:
        RequestError: a file that is not an image, or one larger than ``max_pixels``.
    """
    opened = {}
    for key, path in images.items():
        try:
            with PIL.Image.open(path) as image:
                width, height = image.size
                if max_pixels is not None and width * height > max_pixels:
                    msg = f"image {key!r} is {width}x{height}; this server takes at most {max_pixels} pixels"
                    raise RequestError([msg])
                opened[key] = image.convert("L" if "mask" in key else "RGB")
        except (OSError, PIL.Image.DecompressionBombError, SyntaxError, ValueError) as error:
            if isinstance(error, RequestError):
                raise
            raise RequestError([f"image {key!r} is not an image this server can read ({error})"]) from None
    return opened


assert set(PASSED_ON) <= {*SHARED, *WORKFLOW}  # the keys a request passes on are batch keys
