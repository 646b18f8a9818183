"""The Stable Diffusion XL compositions: per-stage auto blocks, the auto blocks and the refiner blocks.

The stages choose their branches as Stable Diffusion's do (``mask_image`` for inpainting, ``image`` for
image-to-image), so each auto step is Stable Diffusion's with SDXL's steps in it.
"""

from __future__ import annotations

from blocks.common.ip_adapter import STAGES_WITH_IP_ADAPTER, IPAdapterStep
from blocks.common.workflows import IMAGE2IMAGE, INPAINTING, TEXT2IMAGE, FamilyBlocks
from blocks.stable_diffusion.modular_blocks import (
    StableDiffusionAutoBeforeDenoiseStep,
    StableDiffusionAutoCheckInputsStep,
    StableDiffusionAutoDenoiseStep,
    StableDiffusionAutoVaeEncoderStep,
)
from modular import SequentialPipelineBlocks

from .before_denoise import (
    StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep,
    StableDiffusionXLImg2ImgPrepareLatentsStep,
    StableDiffusionXLInpaintPrepareLatentsStep,
    StableDiffusionXLPrepareAdditionalConditioningStep,
    StableDiffusionXLPrepareLatentsStep,
)
from .checks import (
    StableDiffusionXLCheckInputsStep,
    StableDiffusionXLImg2ImgCheckInputsStep,
    StableDiffusionXLInpaintCheckInputsStep,
)
from .decoders import StableDiffusionXLDecodeStep
from .denoise import StableDiffusionXLDenoiseStep, StableDiffusionXLInpaintDenoiseStep
from .encoders import (
    StableDiffusionXLInpaintVaeEncoderStep,
    StableDiffusionXLRefinerTextEncoderStep,
    StableDiffusionXLTextEncoderStep,
    StableDiffusionXLVaeEncoderStep,
)
from .inputs import StableDiffusionXLInputStep
from .timesteps import (
    StableDiffusionXLImg2ImgSetTimestepsStep,
    StableDiffusionXLInpaintSetTimestepsStep,
    StableDiffusionXLSetTimestepsStep,
)

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


class StableDiffusionXLAutoCheckInputsStep(StableDiffusionAutoCheckInputsStep):
    """Check the inputs of inpainting, image-to-image or text-to-image before any model runs."""

    block_classes = [
        StableDiffusionXLInpaintCheckInputsStep,
        StableDiffusionXLImg2ImgCheckInputsStep,
        StableDiffusionXLCheckInputsStep,
    ]


class StableDiffusionXLAutoVaeEncoderStep(StableDiffusionAutoVaeEncoderStep):
    """Encode the reference image: the inpainting encoder with a mask, the img2img one with an image only."""

    block_classes = [StableDiffusionXLInpaintVaeEncoderStep, StableDiffusionXLVaeEncoderStep]


class StableDiffusionXLBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: set_timesteps, prepare_latents (noise), prepare_add_cond (time ids)."""

    block_classes = [
        StableDiffusionXLSetTimestepsStep,
        StableDiffusionXLPrepareLatentsStep,
        StableDiffusionXLPrepareAdditionalConditioningStep,
    ]
    block_names = ["set_timesteps", "prepare_latents", "prepare_add_cond"]


class StableDiffusionXLImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image: timesteps cut by strength, noised image latents, micro-conditioning."""

    block_classes = [
        StableDiffusionXLImg2ImgSetTimestepsStep,
        StableDiffusionXLImg2ImgPrepareLatentsStep,
        StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep,
    ]
    block_names = ["set_timesteps", "prepare_latents", "prepare_add_cond"]

    description = (
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

    description = (
        "Inpainting preparation: set_timesteps (cut by strength, default 0.9999), prepare_latents (noise, "
        "mask and masked-image latents), prepare_add_cond (time ids)."
    )


class StableDiffusionXLAutoBeforeDenoiseStep(StableDiffusionAutoBeforeDenoiseStep):
    """Choose the preparation for inpainting, image-to-image or text-to-image."""

    block_classes = [
        StableDiffusionXLInpaintBeforeDenoiseStep,
        StableDiffusionXLImg2ImgBeforeDenoiseStep,
        StableDiffusionXLBeforeDenoiseStep,
    ]


class StableDiffusionXLAutoDenoiseStep(StableDiffusionAutoDenoiseStep):
    """Choose the inpainting loop (with a mask) or the plain loop."""

    block_classes = [StableDiffusionXLInpaintDenoiseStep, StableDiffusionXLDenoiseStep]


class StableDiffusionXLAutoBlocks(FamilyBlocks):
    """Stable Diffusion XL: text-to-image, image-to-image and inpainting, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``inpainting``: needs ``mask_image``, ``image`` and ``prompt``
    """

    block_classes = [
        StableDiffusionXLAutoCheckInputsStep,
        IPAdapterStep,
        StableDiffusionXLTextEncoderStep,
        StableDiffusionXLInputStep,
        StableDiffusionXLAutoVaeEncoderStep,
        StableDiffusionXLAutoBeforeDenoiseStep,
        StableDiffusionXLAutoDenoiseStep,
        StableDiffusionXLDecodeStep,
    ]
    block_names = list(STAGES_WITH_IP_ADAPTER)
    _workflow_map = {"text2image": TEXT2IMAGE, "image2image": IMAGE2IMAGE, "inpainting": INPAINTING}

    description = (
        "Stable Diffusion XL with two CLIP text encoders and micro-conditioning: text-to-image with a prompt, "
        "image-to-image with an image, inpainting with an image and a mask_image."
    )


class StableDiffusionXLRefinerBlocks(FamilyBlocks):
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

    description = (
        "The SDXL refiner: image-to-image with text_encoder_2 alone; chain it after a base pipeline run with "
        "denoising_end and output_type='latent', passing those latents as image with denoising_start."
    )
