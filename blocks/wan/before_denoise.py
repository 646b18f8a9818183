"""Steps that prepare the video latents: the size, the initial noise, and image-to-video's condition."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import torch
from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators
from blocks.common.params import BATCH_SIZE, INITIAL_LATENTS_OUTPUT, tensor_output
from blocks.common.vae import processor_for_vae
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .encoders import FIRST_FRAME, LAST_FRAME
from .inputs import NUM_VIDEOS_PER_PROMPT
from .utils import (
    DEFAULT_FRAMES,
    DEFAULT_HEIGHT,
    DEFAULT_WIDTH,
    EXPAND_TIMESTEPS,
    MODEL_NAME,
    TRANSFORMER,
    VAE,
    VIDEO_PROCESSOR,
    denoiser,
    latent_frames,
    scale_factors,
)

__all__ = [
    "SIZE_INPUTS",
    "WanImage2VideoPrepareLatentsStep",
    "WanPrepareLatentsStep",
    "normalize_latents",
    "resolve_video_size",
]

logger = logging.getLogger(__name__)

NUM_FRAMES = InputParam(
    "num_frames", type_hint=int, default=DEFAULT_FRAMES, description="The number of frames of the video."
)
SIZE_INPUTS = (
    InputParam.template("height", default=DEFAULT_HEIGHT, description="The height in pixels of the video."),
    InputParam.template("width", default=DEFAULT_WIDTH, description="The width in pixels of the video."),
    NUM_FRAMES,
)
_SIZE_OUTPUTS = (
    OutputParam("height", type_hint=int, description="The video height in pixels (a multiple of the patch)."),
    OutputParam("width", type_hint=int, description="The video width in pixels (a multiple of the patch)."),
    OutputParam("num_frames", type_hint=int, description="The number of frames (4k + 1)."),
)


def resolve_video_size(components: Any, height: int, width: int, num_frames: int) -> tuple[int, int, int]:
    """The size the classic pipelines run at: num_frames rounded down to 4k + 1 (the VAE's temporal scale),
    height and width down to multiples of the VAE's spatial scale x the transformer's patch, each with a
    warning when changed."""
    temporal, spatial = scale_factors(components)
    if num_frames % temporal != 1:
        rounded = num_frames // temporal * temporal + 1
        logger.warning(
            "num_frames - 1 must be divisible by %d; num_frames %d is rounded to %d",
            temporal,
            num_frames,
            rounded,
        )
        num_frames = rounded
    num_frames = max(num_frames, 1)
    patch = denoiser(components).config.patch_size
    h_multiple, w_multiple = spatial * patch[1], spatial * patch[2]
    rounded_height, rounded_width = height // h_multiple * h_multiple, width // w_multiple * w_multiple
    if (rounded_height, rounded_width) != (height, width):
        logger.warning(
            "height and width must be multiples of (%d, %d) for the transformer's patches; (%d, %d) becomes (%d, %d)",
            h_multiple,
            w_multiple,
            height,
            width,
            rounded_height,
            rounded_width,
        )
    return rounded_height, rounded_width, num_frames


def _latent_shape(components: Any, total: int, channels: int, height: int, width: int, frames: int) -> tuple:
    _, spatial = scale_factors(components)
    return (total, channels, latent_frames(components, frames), height // spatial, width // spatial)


def _vae_stats(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel latents mean and 1 / std, [1, C, 1, 1, 1] in `like`'s device and dtype."""
    channels = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, channels, 1, 1, 1).to(like.device, like.dtype)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, channels, 1, 1, 1).to(
        like.device, like.dtype
    )
    return mean, inverse_std


def normalize_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """VAE latents as the transformer reads them: (x - mean) / std per channel."""
    mean, inverse_std = _vae_stats(vae, latents)
    return (latents - mean) * inverse_std


def denormalize_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """The inverse of `normalize_latents`: what the VAE decodes."""
    mean, inverse_std = _vae_stats(vae, latents)
    return latents / inverse_std + mean


def _batch_inputs() -> list[InputParam]:
    return [
        *SIZE_INPUTS,
        InputParam.template("latents"),
        InputParam.template("generator"),
        BATCH_SIZE,
        NUM_VIDEOS_PER_PROMPT,
    ]


class WanPrepareLatentsStep(ModularPipelineBlocks):
    """Text-to-video: resolve the size and draw the initial float32 noise, or take the given latents."""

    model_name = MODEL_NAME

    description = (
        "Rounds num_frames to 4k + 1 and height and width to the transformer's patches (with a warning), and "
        "draws float32 latents [batch, transformer.in_channels, (num_frames - 1) / 4 + 1, height / 8, width / 8] "
        "with the generator, or takes `latents` as given."
    )

    # Reads the VAE's scale factors without declaring it: the plan lists the models in the order they run.
    expected_components = [TRANSFORMER]

    inputs = _batch_inputs()

    intermediate_outputs = [INITIAL_LATENTS_OUTPUT, *_SIZE_OUTPUTS]

    def __call__(self, components, state):
        bs = self.get_block_state(state)
        bs.height, bs.width, bs.num_frames = resolve_video_size(
            components, bs.height, bs.width, bs.num_frames
        )
        device = components._execution_device
        if bs.latents is not None:
            bs.latents = bs.latents.to(device=device, dtype=torch.float32)
        else:
            total = bs.batch_size * bs.num_videos_per_prompt
            channels = denoiser(components).config.in_channels
            check_generators(self, bs.generator, total)
            shape = _latent_shape(components, total, channels, bs.height, bs.width, bs.num_frames)
            bs.latents = randn_tensor(shape, generator=bs.generator, device=device, dtype=torch.float32)
        self.set_block_state(state, bs)
        return components, state


class WanImage2VideoPrepareLatentsStep(ModularPipelineBlocks):
    """Image-to-video: the initial noise, and the condition made of the first (and last) frame's latents."""

    model_name = MODEL_NAME

    description = (
        "Draws the float32 noise [batch, vae.z_dim, latent frames, h, w] (or takes `latents`), then encodes the "
        "video made of `image` (resized to height x width), zero frames and `last_image` (if given) with the "
        "VAE (its mode, once per generator of a list) into normalized latents. The condition is those latents "
        "after a 4-channel mask of the given frames; with the repo's expand_timesteps (Wan 2.2 TI2V) it is the "
        "first frame's latents alone, with first_frame_mask (0 on the first latent frame, 1 elsewhere)."
    )

    # Reads the transformer's config without declaring it: the plan lists the models in the order they run.
    expected_components = [VAE, VIDEO_PROCESSOR]
    expected_configs = [EXPAND_TIMESTEPS]

    inputs = [
        attrs.evolve(FIRST_FRAME, required=True),
        LAST_FRAME,
        *_batch_inputs(),
    ]

    intermediate_outputs = [
        INITIAL_LATENTS_OUTPUT,
        *_SIZE_OUTPUTS,
        tensor_output("image_condition_latents", "The condition the transformer reads beside the latents."),
        tensor_output(
            "first_frame_mask", "expand_timesteps: 0 where the first frame's latents stand, else 1."
        ),
    ]

    def _frames(self, components, bs, device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The first and last frames, preprocessed to [images, 3, height, width] float32 in [-1, 1]."""
        _, spatial = scale_factors(components)
        processor = processor_for_vae(components.video_processor, spatial)
        first = processor.preprocess(bs.image, height=bs.height, width=bs.width).to(
            device, dtype=torch.float32
        )
        last = None
        if bs.last_image is not None:
            last = processor.preprocess(bs.last_image, height=bs.height, width=bs.width)
            last = last.to(device, dtype=torch.float32)
        return first, last

    @torch.no_grad()
    def __call__(self, components, state):
        # The classic pipeline's helper (it takes the mode); imported here, as its module imports transformers.
        from diffusers.pipelines.wan.pipeline_wan_i2v import retrieve_latents

        bs = self.get_block_state(state)
        bs.height, bs.width, bs.num_frames = resolve_video_size(
            components, bs.height, bs.width, bs.num_frames
        )
        device = components._execution_device
        vae = components.vae
        total = bs.batch_size * bs.num_videos_per_prompt
        check_generators(self, bs.generator, total)
        shape = _latent_shape(components, total, vae.config.z_dim, bs.height, bs.width, bs.num_frames)
        if bs.latents is None:
            latents = randn_tensor(shape, generator=bs.generator, device=device, dtype=torch.float32)
        else:
            latents = bs.latents.to(device=device, dtype=torch.float32)
        first, last = self._frames(components, bs, device)
        first = first.unsqueeze(2)
        frames, height, width = bs.num_frames, bs.height, bs.width
        expand = bool(getattr(components, "expand_timesteps", False))
        if expand:
            video = first
        elif last is None:
            video = torch.cat(
                [first, first.new_zeros(first.shape[0], first.shape[1], frames - 1, height, width)], 2
            )
        else:
            zeros = first.new_zeros(first.shape[0], first.shape[1], frames - 2, height, width)
            video = torch.cat([first, zeros, last.unsqueeze(2)], dim=2)
        video = video.to(device=vae.device, dtype=vae.dtype)
        if isinstance(bs.generator, list):
            # As the classic pipeline: the mode, encoded once per generator.
            condition = torch.cat(
                [retrieve_latents(vae.encode(video), sample_mode="argmax") for _ in bs.generator]
            )
        else:
            condition = retrieve_latents(vae.encode(video), sample_mode="argmax").repeat(total, 1, 1, 1, 1)
        condition = normalize_latents(vae, condition.to(device=device, dtype=torch.float32))
        _, _, latent_count, latent_height, latent_width = shape
        bs.first_frame_mask = None
        if expand:
            mask = torch.ones(
                1, 1, latent_count, latent_height, latent_width, dtype=torch.float32, device=device
            )
            mask[:, :, 0] = 0
            bs.first_frame_mask = mask
            bs.image_condition_latents = condition
        else:
            bs.image_condition_latents = torch.concat(
                [
                    _frame_mask(
                        components, total, frames, latent_height, latent_width, last is not None, condition
                    ),
                    condition,
                ],
                dim=1,
            )
        bs.latents = latents
        self.set_block_state(state, bs)
        return components, state


def _frame_mask(
    components: Any, total: int, frames: int, height: int, width: int, with_last: bool, like: torch.Tensor
) -> torch.Tensor:
    """Which frames are given, as the transformer reads it: [total, temporal scale, latent frames, h, w], 1 on
    the given frames (the first frame's mask repeated to fill its latent frame)."""
    temporal, _ = scale_factors(components)
    mask = torch.ones(total, 1, frames, height, width)
    mask[:, :, list(range(1, frames - 1 if with_last else frames))] = 0
    first = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=temporal)
    mask = torch.concat([first, mask[:, :, 1:, :]], dim=2)
    mask = mask.view(total, -1, temporal, height, width).transpose(1, 2)
    return mask.to(like.device)
