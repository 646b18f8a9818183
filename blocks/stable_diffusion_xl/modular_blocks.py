"""The Stable Diffusion XL compositions: per-stage auto blocks, the auto blocks and the refiner blocks."""

from __future__ import annotations

from modular import AutoPipelineBlocks, SequentialPipelineBlocks

from .before_denoise import (
    StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep,
    StableDiffusionXLImg2ImgPrepareLatentsStep,
    StableDiffusionXLPrepareAdditionalConditioningStep,
    StableDiffusionXLPrepareLatentsStep,
)
from .decoders import StableDiffusionXLDecodeStep
from .denoise import StableDiffusionXLDenoiseStep
from .encoders import (
    StableDiffusionXLRefinerTextEncoderStep,
    StableDiffusionXLTextEncoderStep,
    StableDiffusionXLVaeEncoderStep,
)
from .inputs import StableDiffusionXLInputStep
from .timesteps import StableDiffusionXLImg2ImgSetTimestepsStep, StableDiffusionXLSetTimestepsStep

__all__ = [
    "StableDiffusionXLAutoVaeEncoderStep",
    "StableDiffusionXLBeforeDenoiseStep",
    "StableDiffusionXLImg2ImgBeforeDenoiseStep",
    "StableDiffusionXLAutoBeforeDenoiseStep",
    "StableDiffusionXLAutoBlocks",
    "StableDiffusionXLRefinerBlocks",
]


class StableDiffusionXLAutoVaeEncoderStep(AutoPipelineBlocks):
    """Encode the reference image for image-to-image; nothing for text-to-image."""

    block_classes = [StableDiffusionXLVaeEncoderStep]
    block_names = ["img2img_vae_encoder"]
    block_trigger_inputs = ["image"]

    @property
    def description(self) -> str:
        return "VAE encoding of the reference image: runs `img2img_vae_encoder` when image is given, else nothing."


class StableDiffusionXLBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image: timesteps, initial noise, micro-conditioning."""

    block_classes = [
        StableDiffusionXLSetTimestepsStep,
        StableDiffusionXLPrepareLatentsStep,
        StableDiffusionXLPrepareAdditionalConditioningStep,
    ]
    block_names = ["set_timesteps", "prepare_latents", "prepare_add_cond"]

    @property
    def description(self) -> str:
        return "Text-to-image preparation: set_timesteps, prepare_latents (initial noise), prepare_add_cond (time ids)."


class StableDiffusionXLImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image: timesteps cut by strength, noised image latents, micro-conditioning."""

    block_classes = [
        StableDiffusionXLImg2ImgSetTimestepsStep,
        StableDiffusionXLImg2ImgPrepareLatentsStep,
        StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep,
    ]
    block_names = ["set_timesteps", "prepare_latents", "prepare_add_cond"]

    @property
    def description(self) -> str:
        return (
            "Image-to-image preparation: set_timesteps (cut by strength or denoising_start), prepare_latents "
            "(noised image latents), prepare_add_cond (time ids, with aesthetic scores for a refiner)."
        )


class StableDiffusionXLAutoBeforeDenoiseStep(AutoPipelineBlocks):
    """Choose the preparation for image-to-image or text-to-image."""

    block_classes = [StableDiffusionXLImg2ImgBeforeDenoiseStep, StableDiffusionXLBeforeDenoiseStep]
    block_names = ["img2img", "text2img"]
    block_trigger_inputs = ["image", None]

    @property
    def description(self) -> str:
        return "Preparation before denoising: `img2img` when image is given, `text2img` otherwise."


class StableDiffusionXLAutoBlocks(SequentialPipelineBlocks):
    """Stable Diffusion XL: text-to-image and image-to-image, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
    """

    block_classes = [
        StableDiffusionXLTextEncoderStep,
        StableDiffusionXLInputStep,
        StableDiffusionXLAutoVaeEncoderStep,
        StableDiffusionXLAutoBeforeDenoiseStep,
        StableDiffusionXLDenoiseStep,
        StableDiffusionXLDecodeStep,
    ]
    block_names = ["text_encoder", "input", "vae_encoder", "before_denoise", "denoise", "decode"]
    _workflow_map = {
        "text2image": {"prompt": True},
        "image2image": {"image": True, "prompt": True},
    }

    @property
    def description(self) -> str:
        return (
            "Stable Diffusion XL with two CLIP text encoders and micro-conditioning: text-to-image with a prompt, "
            "image-to-image with an image."
        )


class StableDiffusionXLRefinerBlocks(SequentialPipelineBlocks):
    """Image-to-image for a refiner-style repo (``text_encoder_2`` only, aesthetic-score conditioning)."""

    block_classes = [
        StableDiffusionXLRefinerTextEncoderStep,
        StableDiffusionXLInputStep,
        StableDiffusionXLVaeEncoderStep,
        StableDiffusionXLImg2ImgBeforeDenoiseStep,
        StableDiffusionXLDenoiseStep,
        StableDiffusionXLDecodeStep,
    ]
    block_names = ["text_encoder", "input", "vae_encoder", "before_denoise", "denoise", "decode"]

    @property
    def description(self) -> str:
        return (
            "The SDXL refiner: image-to-image with text_encoder_2 alone; chain it after a base pipeline run with "
            "denoising_end and output_type='latent', passing those latents as image with denoising_start."
        )
