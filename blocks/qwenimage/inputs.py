"""The step after prompt encoding: count the prompts, cut and repeat the embeddings and masks per image."""

from __future__ import annotations

import torch

from blocks.common.params import BATCH_SIZE_OUTPUT, DTYPE_OUTPUT
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import MAX_SEQUENCE_LENGTH, MODEL_NAME, embeds_input, mask_input

__all__ = ["QwenImageInputStep", "QwenImageEditInputStep", "MAX_SEQUENCE_LENGTH_INPUT", "repeat_embeds"]

MAX_SEQUENCE_LENGTH_INPUT = InputParam(
    "max_sequence_length",
    type_hint=int,
    default=512,
    description=f"Prompt tokens kept per prompt (at most {MAX_SEQUENCE_LENGTH}); longer embeddings are cut.",
)


def repeat_embeds(
    embeds: torch.Tensor, mask: torch.Tensor | None, count: int, max_length: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Embeddings [B, L, D] cut to `max_length` tokens and repeated `count` times per prompt ([p0, p0, p1, p1]);
    the mask cut and repeated as the classic pipelines repeat it, and None when it marks no padding.

    The classic pipelines repeat the 2-D mask with ``repeat(1, count, 1)``, which tiles the whole batch
    ([m0, m1, m0, m1]) where the embeddings are grouped per prompt; done the same way here, so that a mask
    follows the classic pipelines' (with one prompt, or prompts of one length, the two orders agree)."""
    if max_length is not None:
        embeds = embeds[:, :max_length]
    batch, seq_len, _ = embeds.shape
    embeds = embeds.repeat(1, count, 1).view(batch * count, seq_len, -1)
    if mask is None:
        return embeds, None
    if max_length is not None:
        mask = mask[:, :max_length]
    mask = mask.repeat(1, count, 1).view(batch * count, seq_len)
    return embeds, None if mask.all() else mask


def _outputs() -> list[OutputParam]:
    def repeated(name: str) -> OutputParam:
        return OutputParam(name, type_hint=torch.Tensor, description=f"{name}, repeated per image")

    return [
        BATCH_SIZE_OUTPUT,
        DTYPE_OUTPUT,
        *(
            repeated(name)
            for name in (
                "prompt_embeds",
                "prompt_embeds_mask",
                "negative_prompt_embeds",
                "negative_prompt_embeds_mask",
            )
        ),
    ]


class QwenImageInputStep(ModularPipelineBlocks):
    """Count the prompts, cut the embeddings to max_sequence_length and repeat them per image."""

    model_name = MODEL_NAME

    #: Text-to-image cuts the embeddings to max_sequence_length; edit keeps them whole (its image tokens).
    cuts_to_max_length = True

    description = (
        "Reads batch_size (number of prompts) and dtype from prompt_embeds, cuts the embeddings and their masks "
        "to max_sequence_length tokens, and repeats them num_images_per_prompt times per prompt. A mask that "
        "marks no padding becomes None (the transformer then attends to every token)."
    )

    @property
    def inputs(self) -> list[InputParam]:
        inputs = [
            InputParam.template("num_images_per_prompt"),
            embeds_input("prompt_embeds", required=True),
            mask_input("prompt_embeds_mask"),
            embeds_input("negative_prompt_embeds"),
            mask_input("negative_prompt_embeds_mask"),
        ]
        return [*inputs, MAX_SEQUENCE_LENGTH_INPUT] if self.cuts_to_max_length else inputs

    intermediate_outputs = _outputs()

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        count = bs.num_images_per_prompt
        max_length = bs.max_sequence_length if self.cuts_to_max_length else None
        bs.batch_size = bs.prompt_embeds.shape[0]
        bs.dtype = bs.prompt_embeds.dtype
        bs.prompt_embeds, bs.prompt_embeds_mask = repeat_embeds(
            bs.prompt_embeds, bs.prompt_embeds_mask, count, max_length
        )
        if bs.negative_prompt_embeds is not None:
            bs.negative_prompt_embeds, bs.negative_prompt_embeds_mask = repeat_embeds(
                bs.negative_prompt_embeds, bs.negative_prompt_embeds_mask, count, max_length
            )
        self.set_block_state(state, bs)
        return components, state


class QwenImageEditInputStep(QwenImageInputStep):
    """Edit: count the prompts and repeat the embeddings per image (kept whole: they hold the image's tokens)."""

    cuts_to_max_length = False

    description = (
        "Reads batch_size (number of prompts) and dtype from prompt_embeds and repeats the embeddings and their "
        "masks num_images_per_prompt times per prompt; a mask that marks no padding becomes None."
    )
