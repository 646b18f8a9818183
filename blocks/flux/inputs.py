"""The step after prompt encoding: count the prompts and repeat the embeddings per image."""

from __future__ import annotations

import torch

from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME

__all__ = ["FluxInputStep"]

_EMBEDS = ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds")


def repeat_per_image(embeds: torch.Tensor, count: int) -> torch.Tensor:
    """[p0, p1] -> [p0, p0, p1, p1] along dim 0 (count times each): the images of one prompt stay together."""
    batch = embeds.shape[0]
    repeated = embeds.repeat(1, count, *([1] * (embeds.dim() - 2)))
    return repeated.view(batch * count, *embeds.shape[1:])


class FluxInputStep(ModularPipelineBlocks):
    """Count the prompts and repeat the text embeddings for num_images_per_prompt."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Reads batch_size (number of prompts) and dtype from prompt_embeds, and repeats prompt_embeds, "
            "pooled_prompt_embeds and their negatives num_images_per_prompt times per prompt."
        )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("num_images_per_prompt"),
            InputParam.template("prompt_embeds", required=True),
            InputParam(
                "pooled_prompt_embeds", type_hint=torch.Tensor, required=True, description="Pooled CLIP."
            ),
            InputParam.template("negative_prompt_embeds"),
            InputParam("negative_pooled_prompt_embeds", type_hint=torch.Tensor, description="Pooled CLIP."),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam("batch_size", type_hint=int, description="Number of prompts."),
            OutputParam("dtype", type_hint=torch.dtype, description="The dtype of the model inputs."),
            OutputParam.template("prompt_embeds", note="repeated per image"),
            OutputParam(
                "pooled_prompt_embeds",
                type_hint=torch.Tensor,
                kwargs_type="denoiser_input_fields",
                description="Pooled CLIP embeddings (repeated per image).",
            ),
            OutputParam.template("negative_prompt_embeds", note="repeated per image"),
            OutputParam(
                "negative_pooled_prompt_embeds",
                type_hint=torch.Tensor,
                kwargs_type="denoiser_input_fields",
                description="Pooled CLIP embeddings of the negative prompt (repeated per image).",
            ),
        ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        count = block_state.num_images_per_prompt
        block_state.batch_size = block_state.prompt_embeds.shape[0]
        block_state.dtype = block_state.prompt_embeds.dtype
        for name in _EMBEDS:
            embeds = getattr(block_state, name)
            if embeds is not None:
                setattr(block_state, name, repeat_per_image(embeds, count))
        self.set_block_state(state, block_state)
        return components, state
