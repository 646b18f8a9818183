"""The step after prompt encoding: count the prompts and repeat the embeddings per image."""

from __future__ import annotations

import torch

from blocks.common.params import BATCH_SIZE_OUTPUT, DTYPE_OUTPUT
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, do_classifier_free_guidance, embeds_input, guidance_scale, guidance_scale_input

__all__ = ["ZImageInputStep"]


class ZImageInputStep(ModularPipelineBlocks):
    """Count the prompts and repeat the per-prompt embeddings for num_images_per_prompt."""

    model_name = MODEL_NAME

    description = (
        "Reads batch_size (number of prompts) and dtype from prompt_embeds, checks that guidance has one "
        "negative embedding per prompt, and repeats each embedding num_images_per_prompt times "
        "(the images of one prompt stay together)."
    )

    inputs = [
        InputParam.template("num_images_per_prompt"),
        embeds_input("prompt_embeds", required=True),
        embeds_input("negative_prompt_embeds"),
        guidance_scale_input(),
    ]

    intermediate_outputs = [
        BATCH_SIZE_OUTPUT,
        DTYPE_OUTPUT,
        OutputParam.template("prompt_embeds", type_hint=list[torch.Tensor], note="repeated per image"),
        OutputParam.template(
            "negative_prompt_embeds", type_hint=list[torch.Tensor], note="repeated per image"
        ),
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        count = block_state.num_images_per_prompt
        prompt_embeds = list(block_state.prompt_embeds)
        if not prompt_embeds:
            msg = f"{type(self).__name__}: prompt_embeds is an empty list; pass one tensor per prompt"
            raise ValueError(msg)
        negative = block_state.negative_prompt_embeds
        if do_classifier_free_guidance(guidance_scale(components, block_state.guidance_scale)):
            if negative is None or len(negative) != len(prompt_embeds):
                got = "none" if negative is None else len(negative)
                msg = (
                    f"{type(self).__name__}: guidance (guidance_scale > 0) needs one negative embedding per "
                    f"prompt (got {got} for {len(prompt_embeds)} prompts); pass negative_prompt_embeds of the "
                    "same length, or guidance_scale=0"
                )
                raise ValueError(msg)
            block_state.negative_prompt_embeds = [e for e in negative for _ in range(count)]
        block_state.batch_size = len(prompt_embeds)
        block_state.dtype = prompt_embeds[0].dtype
        block_state.prompt_embeds = [e for e in prompt_embeds for _ in range(count)]
        self.set_block_state(state, block_state)
        return components, state
