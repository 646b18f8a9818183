"""The first step of every Flux.2 workflow: refuse bad inputs before any model runs.

As the classic pipeline: a height or width that is not a multiple of twice the VAE's scale is accepted and
rounded down (with a warning); one below that multiple, zero or negative is refused. Given latents are
patchified, [batch, transformer.in_channels, height / (2 * scale), width / (2 * scale)]. Reference images
are PIL images of at least 64 pixels a side and an aspect ratio of at most 8.
"""

from __future__ import annotations

import math
from typing import Any

import PIL.Image

from blocks.common.checks import (
    CheckInputsStep,
    InputProblems,
    batch_total,
    check_counts,
    check_latent_memory,
    check_latents,
    check_prompt,
    check_size,
    model_dtype,
)
from blocks.common.vae import vae_scale_factor
from modular import BlockState, InputParam

from .encoders import MAX_REFERENCE_AREA, PROMPT_INPUTS, REFERENCE_IMAGE, reference_images
from .timesteps import TIMESTEP_INPUTS
from .utils import LATENTS, MODEL_NAME, default_size

__all__ = ["MIN_REFERENCE_SIDE", "MAX_REFERENCE_ASPECT", "Flux2CheckInputsStep", "Flux2EditCheckInputsStep"]

# The classic pipeline's limits on a reference image (Flux2ImageProcessor.check_image_input).
MIN_REFERENCE_SIDE = 64
MAX_REFERENCE_ASPECT = 8


class Flux2CheckInputsStep(CheckInputsStep):
    """Text-to-image: check prompts, counts, size and given latents before any model runs."""

    # The prompt embeddings reach the transformer in the text encoder's dtype, uncast: these must agree.
    same_dtype_models: tuple[str, ...] = ("text_encoder", "transformer")

    model_name = MODEL_NAME

    description = (
        "Checks the inputs before any model runs, and changes nothing: prompts (no empty list), "
        "num_inference_steps and num_images_per_prompt (1 or more), output_type, height and width (at least "
        "twice the VAE's scale; other sizes are rounded down to a multiple of it), the shape of given latents, "
        "and the size of the latents (at most 64 GiB)."
    )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *PROMPT_INPUTS[:2],
            *TIMESTEP_INPUTS,
            InputParam.template("num_images_per_prompt"),
            InputParam.template("height"),
            InputParam.template("width"),
            LATENTS,
            *self.workflow_inputs(),
            InputParam.template("output_type"),
        ]

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        bs = block_state
        check_prompt(problems, "prompt", bs.prompt)
        check_counts(problems, bs)
        image_size = self.check_workflow(components, bs, problems)
        multiple = vae_scale_factor(components) * 2
        before = len(problems)
        check_size(problems, "height", bs.height, multiple, floor=True)
        check_size(problems, "width", bs.width, multiple, floor=True)
        _, total = batch_total(bs)
        transformer = getattr(components, "transformer", None)
        if len(problems) > before or total is None or transformer is None:
            return
        height, width = default_size(components, bs.height or image_size[0], bs.width or image_size[1])
        cells = (int(height) // multiple, int(width) // multiple)
        shape = (total, transformer.config.in_channels // 4 * 4, *cells)
        check_latents(problems, bs.latents, shape, (height, width))
        if bs.latents is None:
            check_latent_memory(problems, shape, model_dtype(components, "transformer"), (height, width))

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems
    ) -> tuple[int | None, int | None]:
        """The reference images of this workflow (none for text-to-image); returns the size they give the
        output, (height, width) or (None, None)."""
        return None, None


class Flux2EditCheckInputsStep(Flux2CheckInputsStep):
    """Editing: also check the reference images."""

    description = (
        "Checks the inputs of editing before any model runs, as text-to-image does, and the reference images: "
        "one PIL image or a non-empty list of them, each at least 64 pixels a side with an aspect ratio of at "
        "most 8. height and width default to the first image's size, rounded down to a multiple of twice the "
        "VAE's scale."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [REFERENCE_IMAGE]

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems
    ) -> tuple[int | None, int | None]:
        images = reference_images(bs.image)
        if not images:
            problems.add("image ([]) is an empty list; pass a PIL image or a list of at least one")
            return None, None
        for index, image in enumerate(images):
            name = "image" if not isinstance(bs.image, list) else f"image[{index}]"
            if not isinstance(image, PIL.Image.Image):
                problems.add(
                    f"{name} must be a PIL image (got a {type(image).__name__}); pass PIL.Image.Image objects",
                    wrong_type=True,
                )
                continue
            width, height = image.size
            if min(width, height) < MIN_REFERENCE_SIDE:
                problems.add(
                    f"{name} ({width}x{height}) must be at least {MIN_REFERENCE_SIDE} pixels a side; "
                    "pass a larger image"
                )
            elif max(width / height, height / width) > MAX_REFERENCE_ASPECT:
                problems.add(
                    f"{name} ({width}x{height}) must have an aspect ratio of at most {MAX_REFERENCE_ASPECT}:1; "
                    "crop it"
                )
        first = images[0]
        if not isinstance(first, PIL.Image.Image) or min(first.size) < MIN_REFERENCE_SIDE:
            return None, None
        width, height = first.size
        if width * height > MAX_REFERENCE_AREA:
            scale = math.sqrt(MAX_REFERENCE_AREA / (width * height))
            width, height = int(width * scale), int(height * scale)
        multiple = vae_scale_factor(components) * 2
        return height // multiple * multiple, width // multiple * multiple
