"""Stable Diffusion XL as modular blocks: text-to-image and image-to-image, and the refiner.

``StableDiffusionXLAutoBlocks`` picks the workflow from the inputs given (``image`` for image-to-image).
``StableDiffusionXLRefinerBlocks`` serves refiner-style repos (``text_encoder_2`` only). ``FAMILY``
registers the auto blocks for the classic ``StableDiffusionXL*Pipeline`` repos (entry point group
``modular.blocks``).
"""

from modular import BlockFamily

from .before_denoise import (
    StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep,
    StableDiffusionXLImg2ImgPrepareLatentsStep,
    StableDiffusionXLPrepareAdditionalConditioningStep,
    StableDiffusionXLPrepareLatentsStep,
)
from .decoders import StableDiffusionXLDecodeStep
from .denoise import (
    StableDiffusionXLDenoiseStep,
    StableDiffusionXLLoopAfterDenoiser,
    StableDiffusionXLLoopBeforeDenoiser,
    StableDiffusionXLLoopDenoiser,
)
from .encoders import (
    StableDiffusionXLRefinerTextEncoderStep,
    StableDiffusionXLTextEncoderStep,
    StableDiffusionXLVaeEncoderStep,
)
from .inputs import StableDiffusionXLInputStep
from .modular_blocks import (
    StableDiffusionXLAutoBeforeDenoiseStep,
    StableDiffusionXLAutoBlocks,
    StableDiffusionXLAutoVaeEncoderStep,
    StableDiffusionXLBeforeDenoiseStep,
    StableDiffusionXLImg2ImgBeforeDenoiseStep,
    StableDiffusionXLRefinerBlocks,
)
from .timesteps import StableDiffusionXLImg2ImgSetTimestepsStep, StableDiffusionXLSetTimestepsStep
from .tiny import make_tiny_repo

FAMILY = BlockFamily(
    name="stable-diffusion-xl",
    blocks_class=StableDiffusionXLAutoBlocks,
    classic_pipelines=("StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"),
    make_tiny_repo=make_tiny_repo,
)

__all__ = [
    "FAMILY",
    "StableDiffusionXLAutoBeforeDenoiseStep",
    "StableDiffusionXLAutoBlocks",
    "StableDiffusionXLAutoVaeEncoderStep",
    "StableDiffusionXLBeforeDenoiseStep",
    "StableDiffusionXLDecodeStep",
    "StableDiffusionXLDenoiseStep",
    "StableDiffusionXLImg2ImgBeforeDenoiseStep",
    "StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep",
    "StableDiffusionXLImg2ImgPrepareLatentsStep",
    "StableDiffusionXLImg2ImgSetTimestepsStep",
    "StableDiffusionXLInputStep",
    "StableDiffusionXLLoopAfterDenoiser",
    "StableDiffusionXLLoopBeforeDenoiser",
    "StableDiffusionXLLoopDenoiser",
    "StableDiffusionXLPrepareAdditionalConditioningStep",
    "StableDiffusionXLPrepareLatentsStep",
    "StableDiffusionXLRefinerBlocks",
    "StableDiffusionXLRefinerTextEncoderStep",
    "StableDiffusionXLSetTimestepsStep",
    "StableDiffusionXLTextEncoderStep",
    "StableDiffusionXLVaeEncoderStep",
    "make_tiny_repo",
]
