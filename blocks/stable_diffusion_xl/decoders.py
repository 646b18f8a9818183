"""Decoding: VAE decode of the denoised latents (upcast when needed) and post-processing."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL

from blocks.stable_diffusion.decoders import OUTPUT_TYPES
from blocks.stable_diffusion.encoders import IMAGE_PROCESSOR
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, latents_stats, vae_in_float32

__all__ = ["StableDiffusionXLDecodeStep"]


class StableDiffusionXLDecodeStep(ModularPipelineBlocks):
    """Decode latents with the VAE and post-process them into PIL images, numpy arrays or tensors."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Un-normalizes the latents (by scaling_factor, and latents_mean / latents_std when the VAE has them), "
            "decodes them with the VAE, in float32 when the VAE is float16 and its config sets force_upcast "
            "(SDXL's VAE overflows in float16), and post-processes to output_type: 'pil', 'np', 'pt', or "
            "'latent' (the latents, not decoded)."
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
        bs = self.get_block_state(state)
        if bs.output_type not in OUTPUT_TYPES:
            msg = f"{type(self).__name__}: output_type must be one of {list(OUTPUT_TYPES)} (got {bs.output_type!r})"
            raise ValueError(msg)
        latents = bs.latents
        if bs.output_type == "latent":
            bs.images = latents
        else:
            vae = components.vae
            upcast = vae.dtype == torch.float16 and bool(getattr(vae.config, "force_upcast", False))
            with vae_in_float32(vae, upcast):
                latents = latents.to(vae.post_quant_conv.weight.dtype if upcast else latents.dtype)
                stats = latents_stats(vae, latents)
                if stats is None:
                    latents = latents / vae.config.scaling_factor
                else:
                    mean, std = stats
                    latents = latents * std / vae.config.scaling_factor + mean
                image = vae.decode(latents, return_dict=False)[0]
            bs.images = components.image_processor.postprocess(image, output_type=bs.output_type)
        self.set_block_state(state, bs)
        return components, state
