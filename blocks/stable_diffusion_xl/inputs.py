"""The step after prompt encoding: count the prompts and repeat every embedding per image."""

from __future__ import annotations

import torch

from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME

__all__ = ["StableDiffusionXLInputStep"]


class StableDiffusionXLInputStep(ModularPipelineBlocks):
    """Count the prompts and repeat the text and pooled embeddings for num_images_per_prompt."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Reads batch_size (number of prompts) and dtype from prompt_embeds, and repeats prompt_embeds, "
            "pooled_prompt_embeds and their negatives num_images_per_prompt times per prompt."
        )

    @property
    def inputs(self) -> list[InputParam]:
        pooled = "Pooled text embeddings of the prompt."
        return [
            InputParam.template("num_images_per_prompt"),
            InputParam.template("prompt_embeds", required=True),
            InputParam.template("negative_prompt_embeds"),
            InputParam("pooled_prompt_embeds", type_hint=torch.Tensor, required=True, description=pooled),
            InputParam(
                "negative_pooled_prompt_embeds", type_hint=torch.Tensor, description="Pooled negatives."
            ),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        note = "repeated per image"
        return [
            OutputParam("batch_size", type_hint=int, description="Number of prompts."),
            OutputParam("dtype", type_hint=torch.dtype, description="The dtype of the model inputs."),
            OutputParam.template("prompt_embeds", note=note),
            OutputParam.template("negative_prompt_embeds", note=note),
            OutputParam(
                "pooled_prompt_embeds", type_hint=torch.Tensor, description=f"Pooled embeddings ({note})."
            ),
            OutputParam(
                "negative_pooled_prompt_embeds",
                type_hint=torch.Tensor,
                description=f"Pooled negatives ({note}).",
            ),
        ]

    @staticmethod
    def _repeat(embeds: torch.Tensor | None, count: int) -> torch.Tensor | None:
        # [p0, p1] -> [p0, p0, p1, p1]: the images of one prompt stay together.
        if embeds is None:
            return None
        batch, seq_len, _ = embeds.shape
        return embeds.repeat(1, count, 1).view(batch * count, seq_len, -1)

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        count = bs.num_images_per_prompt
        bs.batch_size = bs.prompt_embeds.shape[0]
        bs.dtype = bs.prompt_embeds.dtype
        for name in ("prompt_embeds", "negative_prompt_embeds"):
            setattr(bs, name, self._repeat(getattr(bs, name), count))
        for name in ("pooled_prompt_embeds", "negative_pooled_prompt_embeds"):
            pooled = getattr(bs, name)
            if pooled is not None:
                setattr(bs, name, pooled.repeat(1, count).view(pooled.shape[0] * count, -1))
        self.set_block_state(state, bs)
        return components, state
