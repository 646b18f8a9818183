"""Stable Diffusion 1.x/2.x as modular blocks: text-to-image, image-to-image and inpainting.

``StableDiffusionAutoBlocks`` picks the workflow from the inputs given (``image`` for image-to-image,
``image`` and ``mask_image`` for inpainting). ``FAMILY`` registers the blocks for the classic
``StableDiffusion*Pipeline`` repos (entry point group ``modular.blocks``).
"""

from typing import TYPE_CHECKING

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

FAMILY = BlockFamily(
    name="stable-diffusion",
    blocks_class="blocks.stable_diffusion.modular_blocks.StableDiffusionAutoBlocks",
    classic_pipelines=(
        "StableDiffusionPipeline",
        "StableDiffusionImg2ImgPipeline",
        "StableDiffusionInpaintPipeline",
    ),
    make_tiny_repo="blocks.stable_diffusion.tiny.make_tiny_repo",
    lora_loader="diffusers.loaders.StableDiffusionLoraLoaderMixin",
    ip_adapter_loader="diffusers.loaders.ModularIPAdapterMixin",
    workflows=("text2image", "image2image", "inpainting"),
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
