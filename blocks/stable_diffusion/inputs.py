"""The step after prompt encoding: count the prompts and repeat the embeddings per image."""

from __future__ import annotations

from blocks.common.inputs import RepeatEmbedsInputStep
from modular import InputParam, OutputParam

from .utils import MODEL_NAME

__all__ = ["StableDiffusionInputStep"]


class StableDiffusionInputStep(RepeatEmbedsInputStep):
    """Count the prompts and repeat the text embeddings for num_images_per_prompt."""

    model_name = MODEL_NAME

    inputs = [
        InputParam.template("num_images_per_prompt"),
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
    ]

    @property
    def embeds_outputs(self) -> list[OutputParam]:
        return [
            OutputParam.template("prompt_embeds", note="repeated per image"),
            OutputParam.template("negative_prompt_embeds", note="repeated per image"),
        ]
