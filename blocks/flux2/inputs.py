"""The step after prompt encoding: count the prompts, repeat the embeddings per image, make the text ids."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.batch import repeat_per_image
from blocks.common.params import BATCH_SIZE_OUTPUT, DTYPE_OUTPUT
from modular import InputParam, ModularPipelineBlocks, OutputParam, PipelineState

from .utils import MODEL_NAME, text_ids

__all__ = ["Flux2InputStep"]


class Flux2InputStep(ModularPipelineBlocks):
    """Count the prompts, repeat the text embeddings for num_images_per_prompt, make their position ids."""

    model_name = MODEL_NAME

    description = (
        "Reads batch_size (number of prompts) and dtype from prompt_embeds, repeats them num_images_per_prompt "
        "times per prompt (the images of one prompt together) and makes text_ids [B, seq_len, 4], the "
        "(0, 0, 0, index) position of each text token."
    )

    inputs = [
        InputParam.template("num_images_per_prompt"),
        InputParam.template("prompt_embeds", required=True),
    ]

    intermediate_outputs = [
        BATCH_SIZE_OUTPUT,
        DTYPE_OUTPUT,
        OutputParam.template("prompt_embeds", note="repeated per image"),
        OutputParam(
            "text_ids",
            type_hint=torch.Tensor,
            kwargs_type="denoiser_input_fields",
            description="Position ids of the text tokens, [B, seq_len, 4].",
        ),
    ]

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        embeds = block_state.prompt_embeds
        block_state.batch_size, block_state.dtype = embeds.shape[0], embeds.dtype
        embeds = repeat_per_image(embeds, block_state.num_images_per_prompt)
        block_state.prompt_embeds = embeds
        block_state.text_ids = text_ids(embeds.shape[0], embeds.shape[1]).to(components._execution_device)
        self.set_block_state(state, block_state)
        return components, state
