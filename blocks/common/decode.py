"""The decode step every family ends with: latents in, images out in the requested output type."""

from __future__ import annotations

from typing import Any

import torch

from modular import BlockState, ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam, PipelineState

from .checks import OUTPUT_TYPES, output_type_problem

__all__ = ["OUTPUT_TYPES", "VaeDecodeStep"]


class VaeDecodeStep(ModularPipelineBlocks):
    """Checks ``output_type``, passes latents through for ``"latent"``, else decodes and post-processes.

    A family sets ``image_processor`` (its processor's ComponentSpec) and implements
    :meth:`decode` (latents -> image tensor [B, 3, H, W] in [-1, 1]); it may add inputs with
    ``extra_inputs`` and change :meth:`postprocess`.
    """

    image_processor: ComponentSpec
    latents_description = "The denoised latents."

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("vae", "diffusers.AutoencoderKL"), self.image_processor]

    @property
    def extra_inputs(self) -> list[InputParam]:
        return []

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam(
                "latents", type_hint=torch.Tensor, required=True, description=self.latents_description
            ),
            InputParam.template("output_type"),
            *self.extra_inputs,
        ]

    intermediate_outputs = [OutputParam.template("images")]

    def decode(self, components: Any, block_state: BlockState) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement decode(components, block_state)")

    def postprocess(self, components: Any, image: torch.Tensor, output_type: str) -> Any:
        return components.image_processor.postprocess(image, output_type=output_type)

    @torch.no_grad()
    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        output_type = block_state.output_type
        # The family's check-inputs step refuses a bad output_type before any model runs; this
        # guards the step used on its own.
        problem = output_type_problem(output_type)
        if problem:
            msg = f"{type(self).__name__}: {problem}"
            raise ValueError(msg)
        if output_type == "latent":
            block_state.images = block_state.latents
        else:
            image = self.decode(components, block_state)
            block_state.images = self.postprocess(components, image, output_type)
        self.set_block_state(state, block_state)
        return components, state
