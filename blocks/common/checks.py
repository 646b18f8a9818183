"""Rules for a call's inputs, applied before any model runs; each failure names the input, the rule and the fix.

A family's check-inputs block (the first step of each workflow) reads the inputs and the components'
configs, applies these rules, and raises once for everything that failed: a bad call is refused
before the text encoder, the denoiser or the VAE has done any work.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from modular import BlockState, InputParam, ModularPipelineBlocks, PipelineState

from .image_checks import (
    ImageInfo,
    check_image,
    check_image_count,
    check_mask,
    check_reference_image,
    image_info,
    vae_channels,
)

__all__ = [
    "MAX_LATENT_BYTES",
    "OUTPUT_TYPES",
    "CheckInputsStep",
    "ImageInfo",
    "InputProblems",
    "batch_total",
    "check_at_least_one",
    "check_counts",
    "check_image",
    "check_image_count",
    "check_latent_memory",
    "check_latents",
    "check_mask",
    "check_one_per_prompt",
    "check_output_type",
    "check_prompt",
    "check_reference_image",
    "check_same_dtype",
    "check_size",
    "check_steps_left",
    "check_strength",
    "check_strength_and_steps",
    "image_info",
    "model_dtype",
    "output_type_problem",
    "prompt_count",
    "vae_channels",
]

logger = logging.getLogger(__name__)

OUTPUT_TYPES = ("pil", "np", "pt", "latent")

# Latents beyond this are refused up front: the denoiser's activations would need many times more.
MAX_LATENT_BYTES = 64 * 2**30


class InputProblems:
    """The problems found in one call's inputs, raised together as one error."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._type_only = True

    def add(self, message: str, *, wrong_type: bool = False) -> None:
        """Record one problem; `wrong_type` marks a value of the wrong kind (raised as TypeError)."""
        self.messages.append(message)
        self._type_only = self._type_only and wrong_type

    def __len__(self) -> int:
        return len(self.messages)

    def raise_for(self, block_name: str) -> None:
        """Raise one error listing every problem (TypeError when all are of type), or nothing if none."""
        if not self.messages:
            return
        if len(self.messages) == 1:
            msg = f"{block_name}: {self.messages[0]}"
        else:
            listed = "".join(f"\n  - {message}" for message in self.messages)
            msg = f"{block_name}: {len(self.messages)} problems with the inputs:{listed}"
        raise (TypeError if self._type_only else ValueError)(msg)


class CheckInputsStep(ModularPipelineBlocks):
    """Checks a call's inputs before any model runs; a family subclass declares the inputs and the rules.

    The block reads the components' configs but declares no components: the plan the pipeline gives
    the offload manager lists the models in the order they *run*, and this block runs none. It writes
    nothing into the state. It raises one ValueError (TypeError when every problem is a wrong type)
    that lists every problem found.

    Attributes:
        same_dtype_models: The models that run on each other's outputs without a cast (the text encoders and
            the denoiser); loaded in different dtypes they are refused here (``check_same_dtype``), before the
            first of them runs, rather than failing inside the denoiser after the text encoder ran.
    """

    intermediate_outputs = []
    same_dtype_models: tuple[str, ...] = ()

    def workflow_inputs(self) -> list[InputParam]:
        """The inputs this workflow adds (its reference image, its size), where the family's ``inputs`` puts
        them; none by default."""
        return []

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        """Add to `problems` what is wrong with the inputs in `block_state`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement check(components, block_state, problems)"
        )

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        problems = InputProblems()
        self.check(components, self.get_block_state(state), problems)
        check_same_dtype(problems, components, self.same_dtype_models)
        problems.raise_for(type(self).__name__)
        return components, state


# ----- numbers -----


def check_at_least_one(problems: InputProblems, name: str, value: int | None, what: str) -> None:
    """A count (``num_inference_steps``, ``num_images_per_prompt``) must be 1 or more."""
    if value is not None and value < 1:
        problems.add(f"{name} ({value}) must be at least 1; pass a positive number of {what}")


def check_size(
    problems: InputProblems, name: str, value: int | None, multiple: int, *, floor: bool = False
) -> None:
    """``height`` or ``width`` must be a positive multiple of `multiple`.

    With `floor` (Flux, as its classic pipelines) another size is accepted and rounded down to a
    multiple, with a warning; it must still be at least one multiple.
    """
    if value is None:
        return
    if value <= 0:
        problems.add(
            f"{name} ({value}) must be positive; pass a multiple of {multiple} such as {multiple}, or leave {name} unset"
        )
        return
    lower = value // multiple * multiple
    if floor and lower == 0:
        problems.add(
            f"{name} ({value}) must be at least {multiple}; pass {multiple} or more, or leave {name} unset"
        )
    elif floor and lower != value:
        logger.warning(
            "%s (%d) is not divisible by %d; it is rounded down to %d", name, value, multiple, lower
        )
    elif lower != value:
        such = f"{lower} or {lower + multiple}" if lower else f"{multiple}"
        problems.add(
            f"{name} ({value}) must be divisible by {multiple}; pass a multiple of {multiple} such as {such}"
        )


def output_type_problem(output_type: Any) -> str | None:
    """What is wrong with `output_type`, or None."""
    if output_type in OUTPUT_TYPES:
        return None
    return f"output_type ({output_type!r}) must be one of {list(OUTPUT_TYPES)}; pass one of those"


def check_output_type(problems: InputProblems, output_type: Any) -> None:
    """``output_type`` must be one the decode step makes."""
    problem = output_type_problem(output_type)
    if problem:
        problems.add(problem)


def check_strength(problems: InputProblems, strength: float | None) -> None:
    """``strength`` must be in [0, 1]."""
    if strength is not None and not 0 <= strength <= 1:
        problems.add(
            f"strength ({strength}) must be in [0, 1]; pass 0 to keep the image, 1 to replace it, or a value between"
        )


def check_steps_left(problems: InputProblems, strength: float, steps: int, kept: int) -> None:
    """Image-to-image keeps `kept` of `steps` steps for `strength`; none left is an error."""
    if steps >= 1 and kept < 1:
        problems.add(
            f"strength ({strength}) with num_inference_steps ({steps}) leaves {kept} denoising steps; "
            "raise strength or num_inference_steps"
        )


def check_strength_and_steps(
    problems: InputProblems,
    strength: float | None,
    default: float,
    steps: int | None,
    kept_steps: Callable[[int, float], int],
    *,
    custom: bool = False,
) -> None:
    """``strength`` (`default` when None) in [0, 1], keeping at least one of `steps` denoising steps.

    Args:
        kept_steps: how the family counts the steps a strength keeps (steps, strength) -> kept.
        custom: the steps are not counted from num_inference_steps here (custom timesteps or sigmas, a
            given start), so only the range is checked; the timesteps step counts them later.
    """
    check_strength(problems, strength)
    strength = default if strength is None else strength
    if 0 <= strength <= 1 and not custom and steps is not None:
        check_steps_left(problems, strength, steps, kept_steps(steps, strength))


def check_counts(problems: InputProblems, bs: Any) -> None:
    """``num_inference_steps`` and ``num_images_per_prompt`` are 1 or more, ``output_type`` a known one."""
    check_at_least_one(problems, "num_inference_steps", bs.num_inference_steps, "denoising steps")
    check_at_least_one(problems, "num_images_per_prompt", bs.num_images_per_prompt, "images per prompt")
    check_output_type(problems, bs.output_type)


# ----- prompts -----


def prompt_count(prompt: str | list[str] | None, prompt_embeds: Any) -> int | None:
    """The number of prompts, from the prompt or from its embeddings (a tensor or a list); None if neither."""
    if prompt is not None:
        return 1 if isinstance(prompt, str) else len(prompt)
    if prompt_embeds is not None:
        return len(prompt_embeds)
    return None


def batch_total(bs: Any) -> tuple[int | None, int | None]:
    """The number of prompts and the batch (prompts x num_images_per_prompt); None where not known or not valid."""
    count = prompt_count(bs.prompt, bs.prompt_embeds)
    per_prompt = bs.num_images_per_prompt
    total = count * per_prompt if count and per_prompt is not None and per_prompt >= 1 else None
    return count, total


def check_prompt(problems: InputProblems, name: str, prompt: str | list[str] | None) -> None:
    """A list of prompts must hold at least one."""
    if isinstance(prompt, list) and not prompt:
        problems.add(f"{name} ([]) is an empty list; pass a string or a list of at least one string")


def check_one_per_prompt(
    problems: InputProblems,
    name: str,
    value: str | list[str] | None,
    prompt: str | list[str] | None,
    *,
    same_type: bool = False,
    one_for_all: bool = False,
) -> None:
    """A text that goes with the prompt (a negative prompt, a second prompt) gives one entry per prompt.

    Args:
        same_type: the family wants a str for a str prompt and a list for a list (SD, Flux negatives).
        one_for_all: a single string serves every prompt (SDXL negatives); otherwise it counts as one entry.
    """
    if value is None or prompt is None:
        return
    if same_type and type(value) is not type(prompt):
        problems.add(
            f"{name} (a {type(value).__name__}) must have the type of prompt (a {type(prompt).__name__}); "
            "pass both as str or both as list",
            wrong_type=True,
        )
        return
    if isinstance(value, str) and one_for_all:
        return
    entries = 1 if isinstance(value, str) else len(value)
    prompts = 1 if isinstance(prompt, str) else len(prompt)
    if entries != prompts:
        noun = "entry" if entries == 1 else "entries"
        prompt_noun = "prompt" if prompts == 1 else "prompts"
        alternative = ", or one string for all" if one_for_all else ""
        problems.add(
            f"{name} has {entries} {noun} for {prompts} {prompt_noun}; pass one per prompt{alternative}"
        )


# ----- latents -----


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("*" if size is None else str(size) for size in shape) + ")"


def check_latents(
    problems: InputProblems,
    latents: torch.Tensor | None,
    expected: tuple[int | None, ...],
    size: tuple[int, int] | None = None,
) -> None:
    """Given latents must have the `expected` shape (None: any size in that dimension).

    Args:
        expected: the shape; its first entry is the batch (prompts x num_images_per_prompt).
        size: the image's (height, width) in pixels that the shape follows from, for the message.
    """
    if latents is None:
        return
    actual = tuple(latents.shape)
    fits = len(actual) == len(expected) and all(e is None or e == a for e, a in zip(expected, actual))
    if not fits:
        at = f" at {size[0]}x{size[1]} pixels" if size else ""
        problems.add(
            f"latents (shape {actual}) must have shape {_shape_text(expected)} for a batch of {expected[0]} "
            f"(prompts x num_images_per_prompt){at}; pass latents of that shape, or none"
        )


def _bytes_text(count: int) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def check_latent_memory(
    problems: InputProblems,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    size: tuple[int, int] | None = None,
    limit: int = MAX_LATENT_BYTES,
) -> None:
    """The latents a call allocates (batch x channels x height x width) must stay under `limit` bytes.

    Args:
        shape: the latents' shape; its first entry is the batch (prompts x num_images_per_prompt).
        size: the image's (height, width) in pixels, for the message.
    """
    element = torch.empty((), dtype=dtype).element_size()
    count = math.prod(shape) * element
    if count > limit:
        dims = " x ".join(str(dim) for dim in shape)
        at = f" at {size[0]}x{size[1]} pixels" if size else ""
        problems.add(
            f"latents for a batch of {shape[0]} (prompts x num_images_per_prompt){at} would take "
            f"{_bytes_text(count)} ({dims} x {element} bytes), over the limit of {_bytes_text(limit)}; "
            "lower num_images_per_prompt, the number of prompts, or height and width"
        )


def check_same_dtype(problems: InputProblems, components: Any, names: tuple[str, ...]) -> None:
    """The loaded models among `names` share one floating dtype; a problem naming each model and its dtype, and
    the fix, when they do not (a torchao-quantized model loaded without ``torch_dtype`` is bfloat16 while the
    others load in float32: tests/modular/test_quantized_pipelines.py)."""
    dtypes: dict[str, torch.dtype] = {}
    for name in names:
        model = getattr(components, name, None)
        dtype = getattr(model, "dtype", None) if isinstance(model, torch.nn.Module) else None
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            dtypes[name] = dtype
    if len(set(dtypes.values())) <= 1:
        return
    listed = ", ".join(f"{name} ({dtype})" for name, dtype in dtypes.items())
    kinds = sorted({str(dtype) for dtype in dtypes.values()})
    problems.add(
        f"the models {listed} are loaded in different dtypes, and each runs on the others' outputs; load them "
        f"in one: pipe.load_components(torch_dtype=...) with one of {kinds} for all of them (a torchao-quantized "
        "model loaded without torch_dtype is torch.bfloat16)"
    )


def model_dtype(components: Any, name: str) -> torch.dtype:
    """The dtype of the named model's weights (float32 when it is not loaded), to size its latents."""
    model = getattr(components, name, None)
    return getattr(model, "dtype", torch.float32) if model is not None else torch.float32
