"""The step after prompt encoding: count the prompts and repeat the embeddings per image."""

from __future__ import annotations

import torch

from blocks.common.inputs import RepeatEmbedsInputStep
from modular import InputParam, OutputParam

from .utils import MODEL_NAME, pooled_input

__all__ = ["SD3InputStep"]


def _pooled_output(name: str, description: str) -> OutputParam:
    return OutputParam(
        name, type_hint=torch.Tensor, kwargs_type="denoiser_input_fields", description=description
    )


class SD3InputStep(RepeatEmbedsInputStep):
    """Count the prompts and repeat the text embeddings for num_images_per_prompt."""

    model_name = MODEL_NAME

    inputs = [
        InputParam.template("num_images_per_prompt"),
        InputParam.template("prompt_embeds", required=True),
        pooled_input("pooled_prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
        pooled_input("negative_pooled_prompt_embeds"),
    ]

    @property
    def embeds_outputs(self) -> list[OutputParam]:
        return [
            OutputParam.template("prompt_embeds", note="repeated per image"),
            _pooled_output("pooled_prompt_embeds", "Pooled CLIP embeddings (repeated per image)."),
            OutputParam.template("negative_prompt_embeds", note="repeated per image"),
            _pooled_output(
                "negative_pooled_prompt_embeds",
                "Pooled CLIP embeddings of the negative prompt (repeated per image).",
            ),
        ]
