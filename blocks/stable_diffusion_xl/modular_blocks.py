"""The Stable Diffusion XL compositions: per-stage auto blocks, the auto blocks and the refiner blocks."""

from __future__ import annotations

from modular import AutoPipelineBlocks, SequentialPipelineBlocks

from .before_denoise import (
    StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep,
    StableDiffusionXLImg2ImgPrepareLatentsStep,
    StableDiffusionXLPrepareAdditionalConditioningStep,
    StableDiffusionXLPrepareLatentsStep,
)
from .checks import (
    StableDiffusionXLCheckInputsStep,
    StableDiffusionXLImg2ImgCheckInputsStep,
    StableDiffusionXLInpaintCheckInputsStep,
)
from .decoders import StableDiffusionXLDecodeStep
from .denoise import StableDiffusionXLDenoiseStep
from .encoders import (
    StableDiffusionXLRefinerTextEncoderStep,
    StableDiffusionXLTextEncoderStep,
    StableDiffusionXLVaeEncoderStep,
)
from .inpainting import (
    StableDiffusionXLInpaintDenoiseStep,
    StableDiffusionXLInpaintPrepareLatentsStep,
    StableDiffusionXLInpaintSetTimestepsStep,
    StableDiffusionXLInpaintVaeEncoderStep,
)
from .inputs import StableDiffusionXLInputStep
from .timesteps import StableDiffusionXLImg2ImgSetTimestepsStep, StableDiffusionXLSetTimestepsStep

__all__ = [
    "StableDiffusionXLAutoCheckInputsStep",
    "StableDiffusionXLAutoVaeEncoderStep",
    "StableDiffusionXLBeforeDenoiseStep",
    "StableDiffusionXLImg2ImgBeforeDenoiseStep",
    "StableDiffusionXLInpaintBeforeDenoiseStep",
    "StableDiffusionXLAutoBeforeDenoiseStep",
    "StableDiffusionXLAutoDenoiseStep",
    "StableDiffusionXLAutoBlocks",
    "StableDiffusionXLRefinerBlocks",
]


class StableDiffusionXLAutoCheckInputsStep(AutoPipelineBlocks):
    """Check the inputs of inpainting, image-to-image or text-to-image before any model runs."""

    block_classes = [
        StableDiffusionXLInpaintCheckInputsStep,
        StableDiffusionXLImg2ImgCheckInputsStep,
        StableDiffusionXLCheckInputsStep,
    ]
    block_names = ["inpaint_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["mask_image", "image", None]

    @property
    def description(self) -> str:
        return (
            "Input checks before any model runs: `inpaint_check_inputs` when mask_image is given, "
            "`img2img_check_inputs` when image is given, `check_inputs` otherwise."
        )


class StableDiffusionXLAutoVaeEncoderStep(AutoPipelineBlocks):
    """Encode the reference image: the inpainting encoder with a mask, the img2img one with an image only."""

    block_classes = [StableDiffusionXLInpaintVaeEncoderStep, StableDiffusionXLVaeEncoderStep]
    block_names = ["inpaint_vae_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["mask_image", "image"]

    @property
    def description(self) -> str:
        return (
            "VAE encoding of the reference image: `inpaint_vae_encoder` when mask_image is given, "
            "`img2img_vae_encoder` when image is given, nothing for text-to-image."
        )


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


class StableDiffusionXLInpaintBeforeDenoiseStep(SequentialPipelineBlocks):
    """Inpainting: timesteps cut by strength, initial and mask latents, micro-conditioning."""

    block_classes = [
        StableDiffusionXLInpaintSetTimestepsStep,
        StableDiffusionXLInpaintPrepareLatentsStep,
        StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep,
    ]
    block_names = ["set_timesteps", "prepare_latents", "prepare_add_cond"]

    @property
    def description(self) -> str:
        return (
            "Inpainting preparation: set_timesteps (cut by strength, default 0.9999), prepare_latents (noise, "
            "mask and masked-image latents), prepare_add_cond (time ids)."
        )


class StableDiffusionXLAutoBeforeDenoiseStep(AutoPipelineBlocks):
    """Choose the preparation for inpainting, image-to-image or text-to-image."""

    block_classes = [
        StableDiffusionXLInpaintBeforeDenoiseStep,
        StableDiffusionXLImg2ImgBeforeDenoiseStep,
        StableDiffusionXLBeforeDenoiseStep,
    ]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask_image", "image", None]

    @property
    def description(self) -> str:
        return (
            "Preparation before denoising: `inpaint` when mask_image is given, `img2img` when image is given, "
            "`text2img` otherwise."
        )


class StableDiffusionXLAutoDenoiseStep(AutoPipelineBlocks):
    """Choose the inpainting loop (with a mask) or the plain loop."""

    block_classes = [StableDiffusionXLInpaintDenoiseStep, StableDiffusionXLDenoiseStep]
    block_names = ["inpaint_denoise", "denoise"]
    block_trigger_inputs = ["mask_image", None]

    @property
    def description(self) -> str:
        return "The denoising loop: `inpaint_denoise` when mask_image is given, `denoise` otherwise."


class StableDiffusionXLAutoBlocks(SequentialPipelineBlocks):
    """Stable Diffusion XL: text-to-image, image-to-image and inpainting, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``inpainting``: needs ``mask_image``, ``image`` and ``prompt``
    """

    block_classes = [
        StableDiffusionXLAutoCheckInputsStep,
        StableDiffusionXLTextEncoderStep,
        StableDiffusionXLInputStep,
        StableDiffusionXLAutoVaeEncoderStep,
        StableDiffusionXLAutoBeforeDenoiseStep,
        StableDiffusionXLAutoDenoiseStep,
        StableDiffusionXLDecodeStep,
    ]
    block_names = [
        "check_inputs",
        "text_encoder",
        "input",
        "vae_encoder",
        "before_denoise",
        "denoise",
        "decode",
    ]
    _workflow_map = {
        "text2image": {"prompt": True},
        "image2image": {"image": True, "prompt": True},
        "inpainting": {"mask_image": True, "image": True, "prompt": True},
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
        StableDiffusionXLImg2ImgCheckInputsStep,
        StableDiffusionXLRefinerTextEncoderStep,
        StableDiffusionXLInputStep,
        StableDiffusionXLVaeEncoderStep,
        StableDiffusionXLImg2ImgBeforeDenoiseStep,
        StableDiffusionXLDenoiseStep,
        StableDiffusionXLDecodeStep,
    ]
    block_names = [
        "check_inputs",
        "text_encoder",
        "input",
        "vae_encoder",
        "before_denoise",
        "denoise",
        "decode",
    ]

    @property
    def description(self) -> str:
        return (
            "The SDXL refiner: image-to-image with text_encoder_2 alone; chain it after a base pipeline run with "
            "denoising_end and output_type='latent', passing those latents as image with denoising_start."
        )
