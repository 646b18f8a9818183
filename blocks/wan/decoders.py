"""Decoding: undo the latents' normalization, decode with the 3D VAE, post-process the frames."""

from __future__ import annotations

import torch

from blocks.common.checks import output_type_problem
from blocks.common.vae import processor_for_vae
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .before_denoise import denormalize_latents
from .utils import MODEL_NAME, VAE, VIDEO_PROCESSOR, scale_factors

__all__ = ["OUTPUT_TYPE", "VIDEOS_OUTPUT", "WanDecodeStep", "WanImage2VideoDecodeStep"]

# The classic pipelines' default: frames as numpy arrays.
OUTPUT_TYPE = InputParam.template(
    "output_type",
    default="np",
    description=(
        "Output format: 'np' (array [videos, frames, height, width, 3] in [0, 1]), 'pt' (tensor [videos, frames, "
        "3, height, width]), 'pil' (a list of PIL frames per video) or 'latent' (the latents, not decoded)."
    ),
)
VIDEOS_OUTPUT = OutputParam(
    "videos",
    type_hint=list | torch.Tensor | object,
    description="The generated videos as output_type asks: the classic pipelines' `frames`.",
)


class WanDecodeStep(ModularPipelineBlocks):
    """Decode the latents with the VAE into frames: numpy arrays, tensors, PIL images, or the latents."""

    model_name = MODEL_NAME

    description = (
        "Unless output_type is 'latent', decodes latents * std + mean (the VAE's per-channel statistics) with the "
        "VAE and post-processes the video to output_type: 'np' [videos, frames, height, width, 3], 'pt' [videos, "
        "frames, 3, height, width], 'pil' (a list of PIL frames per video)."
    )

    expected_components = [VAE, VIDEO_PROCESSOR]

    inputs = [
        InputParam("latents", type_hint=torch.Tensor, required=True, description="The denoised latents."),
        OUTPUT_TYPE,
    ]

    intermediate_outputs = [VIDEOS_OUTPUT]

    def final_latents(self, block_state) -> torch.Tensor:
        """The latents to decode (or return): the loop's."""
        return block_state.latents

    @torch.no_grad()
    def __call__(self, components, state):
        bs = self.get_block_state(state)
        problem = output_type_problem(bs.output_type)
        if problem:
            msg = f"{type(self).__name__}: {problem}"
            raise ValueError(msg)
        latents = self.final_latents(bs)
        if bs.output_type == "latent":
            bs.videos = latents
        else:
            vae = components.vae
            latents = denormalize_latents(vae, latents.to(vae.device, dtype=vae.dtype))
            video = vae.decode(latents, return_dict=False)[0]
            processor = processor_for_vae(components.video_processor, scale_factors(components)[1])
            bs.videos = processor.postprocess_video(video, output_type=bs.output_type)
        self.set_block_state(state, bs)
        return components, state


class WanImage2VideoDecodeStep(WanDecodeStep):
    """Image-to-video's decode: with expand_timesteps the image's latents go back on the first latent frame first."""

    description = (
        "With expand_timesteps (Wan 2.2 TI2V) first puts the image's latents back on the first latent frame, as "
        "the classic pipeline does. " + WanDecodeStep.description
    )

    inputs = [
        *WanDecodeStep.inputs,
        InputParam(
            "first_frame_mask", type_hint=torch.Tensor, description="expand_timesteps: 0 on the first frame."
        ),
        InputParam(
            "image_condition_latents", type_hint=torch.Tensor, description="The image-to-video condition."
        ),
    ]

    def final_latents(self, block_state) -> torch.Tensor:
        mask = block_state.first_frame_mask
        if mask is None:
            return block_state.latents
        return (1 - mask) * block_state.image_condition_latents + mask * block_state.latents
