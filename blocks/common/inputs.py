"""The step after prompt encoding: count the prompts and repeat every text embedding per image."""

from __future__ import annotations

from typing import Any

from modular import ModularPipelineBlocks, OutputParam, PipelineState

from .batch import repeat_per_image
from .params import BATCH_SIZE_OUTPUT, DTYPE_OUTPUT

__all__ = ["RepeatEmbedsInputStep"]


class RepeatEmbedsInputStep(ModularPipelineBlocks):
    """Reads batch_size and dtype from ``prompt_embeds`` and repeats each embedding per image.

    A family subclass declares its embeddings as ``inputs`` (``num_images_per_prompt`` among them) and
    lists their repeated forms in ``embeds_outputs``; each given one ([B, ...] tensors) is repeated
    ``num_images_per_prompt`` times per prompt, the images of one prompt together.
    """

    @property
    def description(self) -> str:
        names = self._embeds_names()
        listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
        return (
            f"Reads batch_size (number of prompts) and dtype from prompt_embeds, and repeats {listed} "
            "num_images_per_prompt times per prompt."
        )

    @property
    def embeds_outputs(self) -> list[OutputParam]:
        raise NotImplementedError(
            f"{type(self).__name__} must list its repeated embeddings in embeds_outputs"
        )

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [BATCH_SIZE_OUTPUT, DTYPE_OUTPUT, *self.embeds_outputs]

    def _embeds_names(self) -> list[str]:
        return [output.name for output in self.embeds_outputs if output.name is not None]

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        count = block_state.num_images_per_prompt
        block_state.batch_size = block_state.prompt_embeds.shape[0]
        block_state.dtype = block_state.prompt_embeds.dtype
        for name in self._embeds_names():
            embeds = getattr(block_state, name)
            if embeds is not None:
                setattr(block_state, name, repeat_per_image(embeds, count))
        self.set_block_state(state, block_state)
        return components, state
