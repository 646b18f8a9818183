"""The step after prompt encoding: count the prompts and repeat the embeddings per image."""

from __future__ import annotations

import torch

from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME

__all__ = ["StableDiffusionInputStep"]


class StableDiffusionInputStep(ModularPipelineBlocks):
    """Count the prompts and repeat the text embeddings for num_images_per_prompt."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Reads batch_size (number of prompts) and dtype from prompt_embeds, and repeats prompt_embeds and "
            "negative_prompt_embeds num_images_per_prompt times per prompt."
        )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("num_images_per_prompt"),
            InputParam.template("prompt_embeds", required=True),
            InputParam.template("negative_prompt_embeds"),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam("batch_size", type_hint=int, description="Number of prompts."),
            OutputParam("dtype", type_hint=torch.dtype, description="The dtype of the model inputs."),
            OutputParam.template("prompt_embeds", note="repeated per image"),
            OutputParam.template("negative_prompt_embeds", note="repeated per image"),
        ]

    @staticmethod
    def _repeat(embeds: torch.Tensor, count: int) -> torch.Tensor:
        # [p0, p1] -> [p0, p0, p1, p1]: the images of one prompt stay together.
        batch, seq_len, _ = embeds.shape
        return embeds.repeat(1, count, 1).view(batch * count, seq_len, -1)

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        count = block_state.num_images_per_prompt
        block_state.batch_size = block_state.prompt_embeds.shape[0]
        block_state.dtype = block_state.prompt_embeds.dtype
        block_state.prompt_embeds = self._repeat(block_state.prompt_embeds, count)
        if block_state.negative_prompt_embeds is not None:
            block_state.negative_prompt_embeds = self._repeat(block_state.negative_prompt_embeds, count)
        self.set_block_state(state, block_state)
        return components, state
