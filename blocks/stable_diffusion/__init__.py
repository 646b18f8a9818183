"""Stable Diffusion 1.x/2.x as modular blocks: text-to-image, image-to-image and inpainting.

``StableDiffusionAutoBlocks`` picks the workflow from the inputs given (``image`` for image-to-image,
``image`` and ``mask_image`` for inpainting). ``FAMILY`` registers the blocks for the classic
``StableDiffusion*Pipeline`` repos (entry point group ``modular.blocks``).
"""

from modular import BlockFamily

from .before_denoise import (
    StableDiffusionImg2ImgPrepareLatentsStep,
    StableDiffusionInpaintPrepareLatentsStep,
    StableDiffusionPrepareLatentsStep,
)
from .checks import (
    StableDiffusionCheckInputsStep,
    StableDiffusionImg2ImgCheckInputsStep,
    StableDiffusionInpaintCheckInputsStep,
)
from .decoders import StableDiffusionDecodeStep
from .denoise import (
    StableDiffusionDenoiseLoopWrapper,
    StableDiffusionDenoiseStep,
    StableDiffusionInpaintDenoiseStep,
    StableDiffusionInpaintLoopAfterDenoiser,
    StableDiffusionInpaintLoopBeforeDenoiser,
    StableDiffusionLoopAfterDenoiser,
    StableDiffusionLoopBeforeDenoiser,
    StableDiffusionLoopDenoiser,
)
from .encoders import (
    StableDiffusionInpaintVaeEncoderStep,
    StableDiffusionTextEncoderStep,
    StableDiffusionVaeEncoderStep,
)
from .inputs import StableDiffusionInputStep
from .modular_blocks import (
    StableDiffusionAutoBeforeDenoiseStep,
    StableDiffusionAutoBlocks,
    StableDiffusionAutoCheckInputsStep,
    StableDiffusionAutoDenoiseStep,
    StableDiffusionAutoVaeEncoderStep,
    StableDiffusionBeforeDenoiseStep,
    StableDiffusionImg2ImgBeforeDenoiseStep,
    StableDiffusionInpaintBeforeDenoiseStep,
)
from .timesteps import (
    StableDiffusionImg2ImgSetTimestepsStep,
    StableDiffusionInpaintSetTimestepsStep,
    StableDiffusionSetTimestepsStep,
)
from .tiny import make_tiny_repo, make_tiny_tokenizer

FAMILY = BlockFamily(
    name="stable-diffusion",
    blocks_class=StableDiffusionAutoBlocks,
    classic_pipelines=(
        "StableDiffusionPipeline",
        "StableDiffusionImg2ImgPipeline",
        "StableDiffusionInpaintPipeline",
    ),
    make_tiny_repo=make_tiny_repo,
    lora_loader="diffusers.loaders.StableDiffusionLoraLoaderMixin",
    ip_adapter_loader="diffusers.loaders.ModularIPAdapterMixin",
)

__all__ = [
    "FAMILY",
    "StableDiffusionAutoBeforeDenoiseStep",
    "StableDiffusionAutoBlocks",
    "StableDiffusionAutoCheckInputsStep",
    "StableDiffusionAutoDenoiseStep",
    "StableDiffusionAutoVaeEncoderStep",
    "StableDiffusionBeforeDenoiseStep",
    "StableDiffusionCheckInputsStep",
    "StableDiffusionDecodeStep",
    "StableDiffusionDenoiseLoopWrapper",
    "StableDiffusionDenoiseStep",
    "StableDiffusionImg2ImgBeforeDenoiseStep",
    "StableDiffusionImg2ImgCheckInputsStep",
    "StableDiffusionImg2ImgPrepareLatentsStep",
    "StableDiffusionImg2ImgSetTimestepsStep",
    "StableDiffusionInpaintBeforeDenoiseStep",
    "StableDiffusionInpaintCheckInputsStep",
    "StableDiffusionInpaintDenoiseStep",
    "StableDiffusionInpaintLoopAfterDenoiser",
    "StableDiffusionInpaintLoopBeforeDenoiser",
    "StableDiffusionInpaintPrepareLatentsStep",
    "StableDiffusionInpaintSetTimestepsStep",
    "StableDiffusionInpaintVaeEncoderStep",
    "StableDiffusionInputStep",
    "StableDiffusionLoopAfterDenoiser",
    "StableDiffusionLoopBeforeDenoiser",
    "StableDiffusionLoopDenoiser",
    "StableDiffusionPrepareLatentsStep",
    "StableDiffusionSetTimestepsStep",
    "StableDiffusionTextEncoderStep",
    "StableDiffusionVaeEncoderStep",
    "make_tiny_repo",
    "make_tiny_tokenizer",
]
