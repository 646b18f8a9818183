"""Steps before the denoising loop: the packed initial noise, the image shapes the transformer's RoPE reads,
and the timesteps, shifted by the noise's sequence length."""

from __future__ import annotations

from diffusers.utils.torch_utils import randn_tensor

from blocks.common.batch import check_generators
from blocks.common.params import BATCH_INPUTS, DTYPE, HEIGHT_WIDTH_OUTPUTS, TIMESTEPS_OUTPUTS, tensor_input
from blocks.common.timesteps import scheduler_mu
from modular import InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    MODEL_NAME,
    SCHEDULER,
    TRANSFORMER,
    default_sigmas,
    default_size,
    latent_size,
    pack_latents,
    qwen_vae_scale_factor,
)

__all__ = [
    "QwenImagePrepareLatentsStep",
    "QwenImageEditPrepareLatentsStep",
    "QwenImageSetTimestepsStep",
    "SIGMAS",
]

SIGMAS = InputParam("sigmas", type_hint=list[float], description="Custom sigmas (default: 1 .. 1/steps).")
LATENTS = InputParam.template("latents", note="packed, [B, tokens, C * 4]")
IMG_SHAPES = OutputParam(
    "img_shapes",
    type_hint=list,
    description="Per prompt, the (frames, rows, columns) of each image's tokens, for the transformer's RoPE.",
)


class QwenImagePrepareLatentsStep(ModularPipelineBlocks):
    """Draw the initial noise, packed into 2x2-patch tokens, or take the given latents; and the image shapes."""

    model_name = MODEL_NAME

    description = (
        "Draws noise [batch, 1, C, H / s, W / s] (C: transformer.in_channels / 4; s: the VAE scale) in the "
        "prompt embeddings' dtype with the generator and packs it into [batch, tokens, C * 4], or takes "
        "`latents` (packed) as given. Height and width default to 128 latent cells (1024 pixels). img_shapes: one (1, rows, columns) per prompt for the transformer's RoPE."
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
        OutputParam.template("latents", note="initial, packed"),
        IMG_SHAPES,
        *HEIGHT_WIDTH_OUTPUTS,
    ]

    def image_shapes(self, components, block_state) -> list[tuple[int, int, int]]:
        """The (frames, rows, columns) of the images a sample's tokens hold: the generated image's."""
        scale = qwen_vae_scale_factor(components)
        return [(1, block_state.height // scale // 2, block_state.width // scale // 2)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        bs.height, bs.width = default_size(components, bs.height, bs.width)
        total = bs.batch_size * bs.num_images_per_prompt
        device = components._execution_device
        if bs.latents is None:
            check_generators(self, bs.generator, total)
            channels = components.transformer.config.in_channels // 4
            shape = (total, 1, channels, *latent_size(components, bs.height, bs.width))
            noise = randn_tensor(shape, generator=bs.generator, device=device, dtype=bs.dtype)
            bs.latents = pack_latents(noise, channels)
        else:
            bs.latents = bs.latents.to(device=device, dtype=bs.dtype)
        # One entry per prompt, as the classic pipelines make it (the transformer reads the first).
        bs.img_shapes = [self.image_shapes(components, bs)] * bs.batch_size
        self.set_block_state(state, bs)
        return components, state


class QwenImageEditPrepareLatentsStep(QwenImagePrepareLatentsStep):
    """Edit: the noise as for text-to-image; each sample's tokens also hold the input image's."""

    description = (
        "Draws the packed noise as text-to-image does (or takes `latents`). img_shapes: per prompt, the generated "
        "image's (1, rows, columns) and the input image's, whose latent tokens follow the noise's."
    )

    inputs = [
        *QwenImagePrepareLatentsStep.inputs,
        InputParam(
            "image_height", type_hint=int, required=True, description="The resized input image's height."
        ),
        InputParam(
            "image_width", type_hint=int, required=True, description="The resized input image's width."
        ),
    ]

    def image_shapes(self, components, block_state):
        scale = qwen_vae_scale_factor(components)
        own = super().image_shapes(components, block_state)
        return [*own, (1, block_state.image_height // scale // 2, block_state.image_width // scale // 2)]


class QwenImageSetTimestepsStep(ModularPipelineBlocks):
    """Set the scheduler's timesteps from the sigmas, shifted (mu) by the noise's sequence length."""

    model_name = MODEL_NAME

    description = (
        "Sets the scheduler's timesteps from sigmas 1 .. 1/num_inference_steps (or custom sigmas) with the shift "
        "mu of the latents' sequence length (the scheduler's base and max sequence lengths and shifts)."
    )

    expected_components = [SCHEDULER]

    inputs = [
        InputParam.template("num_inference_steps"),
        SIGMAS,
        tensor_input("latents", "The packed initial latents.", required=True),
    ]

    intermediate_outputs = [*TIMESTEPS_OUTPUTS]

    def __call__(self, components, state):
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import retrieve_timesteps

        block_state = self.get_block_state(state)
        bs = block_state
        sigmas = default_sigmas(bs.num_inference_steps) if bs.sigmas is None else bs.sigmas
        scheduler = components.scheduler
        bs.timesteps, bs.num_inference_steps = retrieve_timesteps(
            scheduler,
            bs.num_inference_steps,
            components._execution_device,
            sigmas=sigmas,
            mu=scheduler_mu(scheduler, bs.latents.shape[1]),
        )
        scheduler.set_begin_index(0)
        self.set_block_state(state, bs)
        return components, state
