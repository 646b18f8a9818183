"""The step after prompt encoding: count the prompts and repeat every embedding per image."""

from __future__ import annotations

from blocks.common.params import tensor_input, tensor_output
from blocks.stable_diffusion.inputs import StableDiffusionInputStep
from modular import OutputParam

from .utils import MODEL_NAME

__all__ = ["StableDiffusionXLInputStep"]


class StableDiffusionXLInputStep(StableDiffusionInputStep):
    """Count the prompts and repeat the text and pooled embeddings for num_images_per_prompt."""

    model_name = MODEL_NAME

    inputs = [
        *StableDiffusionInputStep.inputs,
        tensor_input("pooled_prompt_embeds", "Pooled text embeddings of the prompt.", required=True),
        tensor_input("negative_pooled_prompt_embeds", "Pooled negatives."),
    ]

    @property
    def embeds_outputs(self) -> list[OutputParam]:
        return [
            *super().embeds_outputs,
            tensor_output("pooled_prompt_embeds", "Pooled embeddings (repeated per image)."),
            tensor_output("negative_pooled_prompt_embeds", "Pooled negatives (repeated per image)."),
        ]
