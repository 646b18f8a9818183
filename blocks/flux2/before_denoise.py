"""Steps that prepare what the loop reads: the packed initial latents with their position ids, the guidance."""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators
from blocks.common.params import BATCH_INPUTS, DTYPE, HEIGHT_WIDTH_OUTPUTS, tensor_input
from blocks.common.vae import vae_scale_factor
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import LATENTS, MODEL_NAME, TRANSFORMER, default_size, latent_ids, pack_latents

__all__ = ["GUIDANCE_SCALE", "Flux2PrepareLatentsStep", "Flux2GuidanceStep"]

GUIDANCE_SCALE = 4.0  # the classic pipeline's default


class Flux2PrepareLatentsStep(ModularPipelineBlocks):
    """Draw the initial noise (or take the given latents), make its position ids, pack it into tokens."""

    model_name = MODEL_NAME

    description = (
        "Draws initial noise [B, C, h, w] with the generator (C = transformer.in_channels, the patchified "
        "channels; h and w the image size over twice the VAE's scale), or takes the given patchified `latents`; "
        "makes latent_ids [B, h * w, 4], the (0, row, column, 0) position of each cell, and packs the cells into "
        "latents [B, h * w, C]. height and width default to 128 latent cells in pixels."
    )

    expected_components = [TRANSFORMER]

    inputs = [
        InputParam.template("height"),
        InputParam.template("width"),
        LATENTS,
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [
        OutputParam(
            "latents", type_hint=torch.Tensor, description="The packed initial latents [B, tokens, C]."
        ),
        OutputParam(
            "latent_ids",
            type_hint=torch.Tensor,
            kwargs_type="denoiser_input_fields",
            description="Position ids of the latent tokens, [B, tokens, 4].",
        ),
        *HEIGHT_WIDTH_OUTPUTS,
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        patch = vae_scale_factor(components) * 2
        cells = (int(height) // patch, int(width) // patch)
        total = block_state.batch_size * block_state.num_images_per_prompt
        device, dtype = components._execution_device, block_state.dtype
        latents = block_state.latents
        if latents is None:
            check_generators(self, block_state.generator, total)
            shape = (total, components.transformer.config.in_channels // 4 * 4, *cells)
            latents = randn_tensor(shape, generator=block_state.generator, device=device, dtype=dtype)
        else:
            latents = latents.to(device=device, dtype=dtype)
        block_state.latent_ids = latent_ids(latents.shape[0], *latents.shape[2:]).to(device)
        block_state.latents = pack_latents(latents)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state


class Flux2GuidanceStep(ModularPipelineBlocks):
    """The embedded guidance value per image: Flux.2 is guidance-distilled, the scale is a model input."""

    model_name = MODEL_NAME

    description = (
        "Makes guidance, guidance_scale (default 4.0) repeated per image in float32, which the transformer "
        "embeds beside the timestep (FLUX.2 is guidance-distilled: one prediction per step, no negative prompt)."
    )

    inputs = [
        InputParam.template(
            "guidance_scale",
            default=GUIDANCE_SCALE,
            description="Embedded guidance scale (default 4.0); higher follows the prompt more closely.",
        ),
        tensor_input("latents", "The packed latents.", required=True),
    ]

    intermediate_outputs = [
        OutputParam(
            "guidance",
            type_hint=torch.Tensor,
            kwargs_type="denoiser_input_fields",
            description="The guidance value per image [B].",
        )
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        guidance = torch.full(
            [1], block_state.guidance_scale, device=components._execution_device, dtype=torch.float32
        )
        block_state.guidance = guidance.expand(block_state.latents.shape[0])
        self.set_block_state(state, block_state)
        return components, state
