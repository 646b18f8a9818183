"""Decoding: undo the latent normalization, VAE decode, and post-process to the requested output type."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL

from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import IMAGE_PROCESSOR, MODEL_NAME

__all__ = ["ZImageDecodeStep"]

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


class ZImageDecodeStep(ModularPipelineBlocks):
    """Decode latents with the VAE and post-process them into PIL images, numpy arrays or tensors."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Decodes latents / vae.config.scaling_factor + vae.config.shift_factor with the VAE and "
            "post-processes them to output_type: 'pil' (list of PIL images), 'np' (array [B, H, W, 3] in "
            "[0, 1]), 'pt' (tensor [B, 3, H, W] in [0, 1]) or 'latent' (the latents, not decoded)."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("vae", AutoencoderKL), IMAGE_PROCESSOR]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam("latents", type_hint=torch.Tensor, required=True, description="The denoised latents."),
            InputParam.template("output_type"),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam.template("images")]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        output_type = block_state.output_type
        if output_type not in OUTPUT_TYPES:
            msg = f"{type(self).__name__}: output_type must be one of {list(OUTPUT_TYPES)} (got {output_type!r})"
            raise ValueError(msg)
        latents = block_state.latents
        if output_type == "latent":
            block_state.images = latents
        else:
            vae = components.vae
            latents = latents.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
            image = vae.decode(latents, return_dict=False)[0]
            block_state.images = components.image_processor.postprocess(image, output_type=output_type)
        self.set_block_state(state, block_state)
        return components, state
