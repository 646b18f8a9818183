"""The step after prompt encoding: count the prompts and repeat the embeddings per video."""

from __future__ import annotations

import torch

from blocks.common.batch import repeat_per_image
from blocks.common.params import BATCH_SIZE_OUTPUT, DTYPE_OUTPUT
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME

__all__ = ["IMAGE_EMBEDS", "NUM_VIDEOS_PER_PROMPT", "WanImage2VideoInputStep", "WanInputStep"]

NUM_VIDEOS_PER_PROMPT = InputParam(
    "num_videos_per_prompt",
    type_hint=int,
    default=1,
    description="The number of videos to generate per prompt.",
)
IMAGE_EMBEDS = InputParam(
    "image_embeds",
    type_hint=torch.Tensor,
    description="Wan 2.1 image-to-video: CLIP hidden states of the frame(s).",
)


class WanInputStep(ModularPipelineBlocks):
    """Count the prompts and repeat each prompt's embeddings num_videos_per_prompt times."""

    model_name = MODEL_NAME

    description = (
        "Reads batch_size (number of prompts) and dtype from prompt_embeds and repeats prompt_embeds (and "
        "negative_prompt_embeds) num_videos_per_prompt times per prompt, the videos of one prompt together."
    )

    inputs = [
        NUM_VIDEOS_PER_PROMPT,
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
    ]

    intermediate_outputs = [
        BATCH_SIZE_OUTPUT,
        DTYPE_OUTPUT,
        OutputParam.template("prompt_embeds", note="repeated per video"),
        OutputParam.template("negative_prompt_embeds", note="repeated per video"),
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        count = block_state.num_videos_per_prompt
        block_state.batch_size = block_state.prompt_embeds.shape[0]
        block_state.dtype = block_state.prompt_embeds.dtype
        block_state.prompt_embeds = repeat_per_image(block_state.prompt_embeds, count)
        if block_state.negative_prompt_embeds is not None:
            block_state.negative_prompt_embeds = repeat_per_image(block_state.negative_prompt_embeds, count)
        self.repeat_more(block_state, block_state.batch_size * count)
        self.set_block_state(state, block_state)
        return components, state

    def repeat_more(self, block_state, total: int) -> None:
        """What a workflow repeats besides the text embeddings, for `total` videos; nothing here."""


class WanImage2VideoInputStep(WanInputStep):
    """Image-to-video: also the frames' CLIP embeddings (Wan 2.1), once per video."""

    description = WanInputStep.description + " The image embeddings (Wan 2.1) are repeated once per video."

    inputs = [*WanInputStep.inputs, IMAGE_EMBEDS]

    intermediate_outputs = [
        *WanInputStep.intermediate_outputs,
        OutputParam(
            "image_embeds", type_hint=torch.Tensor, description="The image embeddings, once per video."
        ),
    ]

    def repeat_more(self, block_state, total: int) -> None:
        if block_state.image_embeds is not None:
            # As the classic pipeline: the frames' embeddings (one image, or the first and last) once per video, in
            # the transformer's dtype.
            block_state.image_embeds = block_state.image_embeds.repeat(total, 1, 1).to(block_state.dtype)
