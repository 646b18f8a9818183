"""Rules for a call's inputs, applied before any model runs; each failure names the input, the rule and the fix.

A family's check-inputs block (the first step of each workflow) reads the inputs and the components'
configs, applies these rules, and raises once for everything that failed: a bad call is refused
before the text encoder, the denoiser or the VAE has done any work.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

import numpy as np
import PIL.Image
import torch

from modular import BlockState, ModularPipelineBlocks, OutputParam, PipelineState

__all__ = [
    "MAX_LATENT_BYTES",
    "OUTPUT_TYPES",
    "CheckInputsStep",
    "ImageInfo",
    "InputProblems",
    "check_at_least_one",
    "check_image",
    "check_image_count",
    "check_latent_memory",
    "check_latents",
    "check_mask",
    "check_one_per_prompt",
    "check_output_type",
    "check_prompt",
    "check_size",
    "check_steps_left",
    "check_strength",
    "image_info",
    "model_dtype",
    "output_type_problem",
    "prompt_count",
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
    """

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return []

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        """Add to `problems` what is wrong with the inputs in `block_state`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement check(components, block_state, problems)"
        )

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        problems = InputProblems()
        self.check(components, self.get_block_state(state), problems)
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


# ----- prompts -----


def prompt_count(prompt: str | list[str] | None, prompt_embeds: Any) -> int | None:
    """The number of prompts, from the prompt or from its embeddings (a tensor or a list); None if neither."""
    if prompt is not None:
        return 1 if isinstance(prompt, str) else len(prompt)
    if prompt_embeds is not None:
        return len(prompt_embeds)
    return None


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


# ----- images -----


class ImageInfo(NamedTuple):
    """What the image processor will see: image count, channels (None: not an image layout), pixel size."""

    images: int
    channels: int | None
    height: int | None
    width: int | None
    kind: str  # "a PIL image in mode 'RGBA'", "a tensor of shape (1, 1, 32, 32)" ...


def image_info(image: Any) -> ImageInfo:
    """Count, channels and size of an image input (PIL, numpy [H, W, C] or tensor [C, H, W], or batches)."""
    items = image if isinstance(image, list) else [image]
    if not items:
        return ImageInfo(0, None, None, None, "an empty list")
    first = items[0]
    if isinstance(first, PIL.Image.Image):
        kind = f"a PIL image in mode {first.mode!r}"
        return ImageInfo(len(items), len(first.getbands()), first.height, first.width, kind)
    if isinstance(first, np.ndarray):
        shape = tuple(first.shape)
        kind = f"an array of shape {shape}"
        if first.ndim == 4:
            return ImageInfo(sum(len(i) for i in items), shape[3], shape[1], shape[2], kind)
        if first.ndim == 3:
            return ImageInfo(len(items), shape[2], shape[0], shape[1], kind)
        if first.ndim == 2:
            return ImageInfo(len(items), 1, shape[0], shape[1], kind)
        return ImageInfo(len(items), None, None, None, kind)
    if isinstance(first, torch.Tensor):
        shape = tuple(first.shape)
        kind = f"a tensor of shape {shape}"
        if first.ndim == 4:
            return ImageInfo(sum(len(i) for i in items), shape[1], shape[2], shape[3], kind)
        if first.ndim == 3:
            return ImageInfo(len(items), shape[0], shape[1], shape[2], kind)
        return ImageInfo(len(items), None, None, None, kind)
    return ImageInfo(len(items), None, None, None, f"a {type(first).__name__}")


def check_image(
    problems: InputProblems, name: str, info: ImageInfo, rgb: int, latent_channels: int | None
) -> None:
    """An image must have the `rgb` channels the VAE encodes (a tensor or array may instead hold latents).

    Args:
        rgb: the VAE's input channels (3).
        latent_channels: channels of an image taken as latents already, or None if the step takes none.
    """
    if info.images == 0:
        problems.add(f"{name} is an empty list; pass an image or a list of at least one")
        return
    if info.channels is None:
        layout = "[H, W, C] or [B, H, W, C]" if "array" in info.kind else "[C, H, W] or [B, C, H, W]"
        problems.add(f"{name} ({info.kind}) is not an image; pass a PIL image, or a {layout} tensor or array")
        return
    if info.channels == rgb:
        return
    if info.kind.startswith("a PIL"):
        problems.add(
            f"{name} has {_channels_text(info.channels)} ({info.kind}), the VAE encodes {rgb}; "
            f"pass an RGB image, e.g. {name}.convert('RGB')"
        )
    elif info.channels != latent_channels:
        latents = f", or {latent_channels} for latents" if latent_channels else ""
        problems.add(f"{name} has {_channels_text(info.channels)} ({info.kind}); pass {rgb} (RGB){latents}")


def _channels_text(count: int) -> str:
    return "1 channel" if count == 1 else f"{count} channels"


def check_image_count(problems: InputProblems, name: str, count: int, total: int) -> None:
    """The images are repeated to the batch, so their count must divide it."""
    if count and total % count:
        problems.add(
            f"{name} holds {count} images for a batch of {total} (prompts x num_images_per_prompt); "
            f"pass a number of images that divides {total}, e.g. 1"
        )


def check_mask(problems: InputProblems, mask: Any, total: int) -> None:
    """A mask is single-channel ([B, 1, H, W] or [B, H, W] as a tensor), its count dividing the batch."""
    if isinstance(mask, torch.Tensor):
        if mask.ndim == 4 and mask.shape[1] != 1:
            problems.add(
                f"mask_image has {mask.shape[1]} channels (a tensor of shape {tuple(mask.shape)}); "
                "pass a single-channel mask, [B, 1, H, W]"
            )
            return
        count = mask.shape[0] if mask.ndim in (3, 4) else 1
    else:
        info = image_info(mask)
        if info.images == 0:
            problems.add("mask_image is an empty list; pass a mask or a list of at least one")
            return
        count = info.images
    check_image_count(problems, "mask_image", count, total)


def model_dtype(components: Any, name: str) -> torch.dtype:
    """The dtype of the named model's weights (float32 when it is not loaded), to size its latents."""
    model = getattr(components, name, None)
    return getattr(model, "dtype", torch.float32) if model is not None else torch.float32
