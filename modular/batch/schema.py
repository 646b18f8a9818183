"""The keys of a batch job file and the check of each value.

Each check returns the value in its normal form or raises ``ValueError`` with the rule and what was
received; ``jobfile.parse_job`` puts the key's name in front and collects every problem.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modular.batch.jobs import seed_problem

__all__ = ["COUNT_KEYS", "DTYPES", "FORMATS", "PROMPT_KEYS", "SHARED", "TOP", "WORKFLOW", "got"]

DTYPES = ("auto", "float32", "float16", "bfloat16")
FORMATS = ("png", "npy")


def got(value: Any) -> str:
    return f"(got {value!r} that is a {type(value).__name__})"


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string {got(value)}")
    return value


def _optional_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string {got(value)}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number {got(value)}")
    return value


def _positive_int(value: Any) -> int:
    if _int(value) < 1:
        raise ValueError(f"must be at least 1 (got {value})")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number {got(value)}")
    return float(value)


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, str) and value.count("x") == 1:
        width, height = value.split("x")
        if width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0:
            return int(width), int(height)
    raise ValueError(f"must be a list of sizes 'WIDTHxHEIGHT' such as '512x768' (got {value!r})")


def _sizes(value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"must be a non-empty list of sizes such as ['512x512', '512x768'] {got(value)}")
    return tuple(_size(item) for item in value)


def _seeds(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(_is_int(item) for item in value):
        raise ValueError(f"must be a non-empty list of whole numbers {got(value)}")
    for number, item in enumerate(value):
        problem = seed_problem(item)  # checked here: the generator would refuse it only after loading
        if problem is not None:
            raise ValueError(f"item {number} {problem}")
    return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {list(choices)} (got {value!r})")
        return value

    return check


def _table(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"must be a table of names to values {got(value)}")
    return dict(value)


# Call inputs the job sets through its own keys; a workflow's 'inputs' may not set them.
OWN_INPUTS = {
    "prompt": "prompts",
    "negative_prompt": "negative_prompt",
    "num_inference_steps": "steps",
    "height": "sizes",
    "width": "sizes",
    "guidance_scale": "guidance_scale",
    "generator": "seed",
    "num_images_per_prompt": "images_per_prompt",
    "output_type": "format",
}


def _inputs(value: Any) -> dict[str, Any]:
    table = _table(value)
    taken = [key for key in table if key in OWN_INPUTS]
    if taken:
        key = taken[0]
        raise ValueError(
            f"sets {key!r}, which the job sets through its key {OWN_INPUTS[key]!r}; use that key"
        )
    return table


def _paths(value: Any) -> dict[str, str]:
    table = _table(value)
    if not all(isinstance(path, str) and path for path in table.values()):
        raise ValueError(f"must map input names to image files, e.g. {{'image': 'cat.png'}} (got {value!r})")
    return table


# Keys a workflow table may set for itself and the top level may set for every workflow.
SHARED: dict[str, Callable[[Any], Any]] = {
    "steps": _positive_int,
    "sizes": _sizes,
    "images_per_prompt": _positive_int,
    "seeds": _seeds,
    "guidance_scale": _number,
    "negative_prompt": _optional_text,
    "dtype": _choice(*DTYPES),
}
TOP: dict[str, Callable[[Any], Any]] = {
    "output": _text,
    "seed": _int,
    "prompts": lambda value: value,  # checked by _prompts
    "prompt_file": _text,
    "output_name": _text,
    "format": _choice(*FORMATS),
    "workflows": lambda value: value,  # checked table by table
    **SHARED,
}
WORKFLOW: dict[str, Callable[[Any], Any]] = {
    "name": _text,
    "repo": _text,
    "workflow": _text,
    "revision": _text,
    "variant": _text,
    "inputs": _inputs,
    "images": _paths,
    **SHARED,
}
PROMPT_KEYS = ("prompt", "negative_prompt", "name")
COUNT_KEYS = frozenset({"seeds", "images_per_prompt"})
