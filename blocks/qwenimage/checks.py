"""The first step of every Qwen-Image workflow: refuse bad inputs before any model runs.

As the classic Qwen-Image pipelines, a height or width that is not a multiple of twice the VAE's scale is
accepted and rounded down (with a warning); one below that multiple, zero or negative is refused. Given
latents are packed, [batch, tokens, channels * 4], and must fit the size.
"""

from __future__ import annotations

from typing import Any

import PIL.Image

from blocks.common.checks import (
    CheckInputsStep,
    InputProblems,
    batch_total,
    check_counts,
    check_latent_memory,
    check_latents,
    check_one_per_prompt,
    check_prompt,
    check_size,
    model_dtype,
)
from modular import BlockState, InputParam

from .before_denoise import LATENTS, SIGMAS
from .encoders import PROMPT_INPUTS
from .encoders_edit import edit_image_size
from .inputs import MAX_SEQUENCE_LENGTH_INPUT
from .utils import MAX_SEQUENCE_LENGTH, MODEL_NAME, default_size, latent_size, qwen_vae_scale_factor

__all__ = ["QwenImageCheckInputsStep", "QwenImageEditCheckInputsStep"]


class QwenImageCheckInputsStep(CheckInputsStep):
    """Text-to-image: check prompts, embeddings, counts, size and packed latents before any model runs."""

    # The text encoder's embeddings reach the transformer in its own dtype, uncast: these must agree.
    same_dtype_models: tuple[str, ...] = ("text_encoder", "transformer")

    model_name = MODEL_NAME

    description = (
        "Checks the inputs before any model runs, and changes nothing: one of prompt and prompt_embeds (and at "
        "most one of negative_prompt and negative_prompt_embeds; a negative prompt of one entry or one per "
        "prompt), masks of their embeddings' shape, max_sequence_length (at most 1024), num_inference_steps and "
        "num_images_per_prompt (1 or more), output_type, height and width (at least twice the VAE's scale; "
        "other sizes are rounded down to a multiple of it), guidance_scale for a guidance-distilled "
        "transformer, the shape of given packed latents, and the size of the latents (at most 64 GiB)."
    )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *PROMPT_INPUTS,
            InputParam(
                "guidance_scale", type_hint=float, description="For a guidance-distilled transformer."
            ),
            InputParam.template("num_inference_steps"),
            SIGMAS,
            InputParam.template("num_images_per_prompt"),
            InputParam.template("height"),
            InputParam.template("width"),
            LATENTS,
            *self.workflow_inputs(),
            InputParam.template("output_type"),
        ]

    def workflow_inputs(self) -> list[InputParam]:
        return [MAX_SEQUENCE_LENGTH_INPUT]

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        bs = block_state
        self.check_prompts(bs, problems)
        check_counts(problems, bs)
        length = getattr(bs, "max_sequence_length", None)
        if length is not None and not 1 <= length <= MAX_SEQUENCE_LENGTH:
            problems.add(
                f"max_sequence_length ({length}) must be in [1, {MAX_SEQUENCE_LENGTH}]; pass at most "
                f"{MAX_SEQUENCE_LENGTH}"
            )
        transformer = getattr(components, "transformer", None)
        if transformer is not None and transformer.config.guidance_embeds and bs.guidance_scale is None:
            problems.add(
                "guidance_scale is needed: the transformer is guidance-distilled; pass guidance_scale=..."
            )
        multiple = qwen_vae_scale_factor(components) * 2
        before = len(problems)
        check_size(problems, "height", bs.height, multiple, floor=True)
        check_size(problems, "width", bs.width, multiple, floor=True)
        _, total = batch_total(bs)
        if len(problems) == before and total is not None and transformer is not None:
            height, width = self.size(components, bs)
            rows, columns = latent_size(components, height, width)
            channels = transformer.config.in_channels
            check_latents(problems, bs.latents, (total, rows * columns // 4, channels), (height, width))
            if bs.latents is None:
                shape = (total, channels // 4, rows, columns)
                check_latent_memory(problems, shape, model_dtype(components, "transformer"), (height, width))

    def size(self, components: Any, bs: BlockState) -> tuple[int, int]:
        """The image size the call makes (1024 x 1024 by default)."""
        return default_size(components, bs.height, bs.width)

    def check_prompts(self, bs: BlockState, problems: InputProblems) -> None:
        if (bs.prompt is None) == (bs.prompt_embeds is None):
            got = "both" if bs.prompt is not None else "neither"
            problems.add(f"pass exactly one of prompt and prompt_embeds (got {got})")
        if bs.negative_prompt is not None and bs.negative_prompt_embeds is not None:
            problems.add("pass at most one of negative_prompt and negative_prompt_embeds (got both)")
        check_prompt(problems, "prompt", bs.prompt)
        if not isinstance(bs.negative_prompt, str):
            check_one_per_prompt(problems, "negative_prompt", bs.negative_prompt, bs.prompt)
        for name in ("prompt_embeds", "negative_prompt_embeds"):
            embeds, mask = getattr(bs, name), getattr(bs, f"{name}_mask")
            if embeds is not None and embeds.dim() != 3:
                problems.add(f"{name} (shape {tuple(embeds.shape)}) must be [batch, seq_len, dim]")
            elif embeds is not None and mask is not None and tuple(mask.shape) != tuple(embeds.shape[:2]):
                problems.add(
                    f"{name}_mask (shape {tuple(mask.shape)}) must have {name}'s batch and length "
                    f"{tuple(embeds.shape[:2])}"
                )


class QwenImageEditCheckInputsStep(QwenImageCheckInputsStep):
    """Edit: also check the input image (one PIL image) and that the prompt is one text."""

    description = (
        "Checks the inputs of edit before any model runs, and changes nothing: prompts, embeddings, counts, "
        "output_type, size and latents as text-to-image (the size defaults to the input image's, resized to "
        "about 1024 x 1024 pixels at its aspect ratio), the image (one PIL image, which the text encoder sees "
        "beside each prompt: so one prompt, or precomputed embeddings of any batch)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [InputParam.template("image", required=True)]

    def size(self, components, bs):
        if not isinstance(bs.image, PIL.Image.Image):
            return default_size(components, bs.height, bs.width)
        return edit_image_size(components, bs.image, bs.height, bs.width)[:2]

    def check(self, components, block_state, problems):
        image, prompt = block_state.image, block_state.prompt
        if not isinstance(image, PIL.Image.Image):
            problems.add(
                f"image must be one PIL image (got {type(image).__name__}): the edit resizes it to its working "
                "size by its aspect ratio, as the classic pipeline does; pass PIL.Image.open(...).convert('RGB')",
                wrong_type=True,
            )
        if isinstance(prompt, list) and len(prompt) > 1:
            problems.add(
                f"prompt has {len(prompt)} entries, but the edit encodes each prompt with the one image; pass one "
                "prompt (num_images_per_prompt for more images), or precomputed prompt_embeds"
            )
        super().check(components, block_state, problems)
