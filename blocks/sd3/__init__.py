"""Stable Diffusion 3 / 3.5 as modular blocks: text-to-image, image-to-image and inpainting.

``SD3AutoBlocks`` picks the workflow from the inputs given (``mask_image`` for inpainting, ``image`` for
image-to-image). ``FAMILY`` registers the blocks for the classic ``StableDiffusion3Pipeline``,
``StableDiffusion3Img2ImgPipeline`` and ``StableDiffusion3InpaintPipeline`` repos (entry point group
``modular.blocks``).
"""

from typing import TYPE_CHECKING

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import (
        SD3Img2ImgPrepareLatentsStep,
        SD3InpaintPrepareLatentsStep,
        SD3InpaintPrepareMaskLatentsStep,
        SD3PrepareLatentsStep,
    )
    from .checks import SD3CheckInputsStep, SD3Img2ImgCheckInputsStep, SD3InpaintCheckInputsStep
    from .decoders import SD3DecodeStep, SD3InpaintDecodeStep
    from .denoise import (
        SD3DenoiseLoopWrapper,
        SD3DenoiseStep,
        SD3InpaintDenoiseStep,
        SD3InpaintLoopAfterDenoiser,
        SD3InpaintLoopBeforeDenoiser,
        SD3LoopAfterDenoiser,
        SD3LoopBeforeDenoiser,
        SD3LoopDenoiser,
    )
    from .encoders import SD3TextEncoderStep
    from .image_encoders import SD3InpaintVaeEncoderStep, SD3VaeEncoderStep
    from .inputs import SD3InputStep
    from .modular_blocks import (
        SD3AutoBeforeDenoiseStep,
        SD3AutoBlocks,
        SD3AutoCheckInputsStep,
        SD3AutoDecodeStep,
        SD3AutoDenoiseStep,
        SD3AutoVaeEncoderStep,
        SD3BeforeDenoiseStep,
        SD3Img2ImgBeforeDenoiseStep,
        SD3InpaintBeforeDenoiseStep,
    )
    from .timesteps import SD3Img2ImgSetTimestepsStep, SD3SetTimestepsStep
    from .tiny import make_tiny_repo

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

FAMILY = BlockFamily(
    name="stable-diffusion-3",
    blocks_class="blocks.sd3.modular_blocks.SD3AutoBlocks",
    classic_pipelines=(
        "StableDiffusion3Pipeline",
        "StableDiffusion3Img2ImgPipeline",
        "StableDiffusion3InpaintPipeline",
    ),
    make_tiny_repo="blocks.sd3.tiny.make_tiny_repo",
    peer_pipeline_class="StableDiffusion3ModularPipeline",
    lora_loader="diffusers.loaders.SD3LoraLoaderMixin",
    workflows=("text2image", "image2image", "inpainting"),
)

__all__ = [
    "FAMILY",
    "SD3AutoBeforeDenoiseStep",
    "SD3AutoBlocks",
    "SD3AutoCheckInputsStep",
    "SD3AutoDecodeStep",
    "SD3AutoDenoiseStep",
    "SD3AutoVaeEncoderStep",
    "SD3BeforeDenoiseStep",
    "SD3CheckInputsStep",
    "SD3DecodeStep",
    "SD3DenoiseLoopWrapper",
    "SD3DenoiseStep",
    "SD3Img2ImgBeforeDenoiseStep",
    "SD3Img2ImgCheckInputsStep",
    "SD3Img2ImgPrepareLatentsStep",
    "SD3Img2ImgSetTimestepsStep",
    "SD3InpaintBeforeDenoiseStep",
    "SD3InpaintCheckInputsStep",
    "SD3InpaintDecodeStep",
    "SD3InpaintDenoiseStep",
    "SD3InpaintLoopAfterDenoiser",
    "SD3InpaintLoopBeforeDenoiser",
    "SD3InpaintPrepareLatentsStep",
    "SD3InpaintPrepareMaskLatentsStep",
    "SD3InpaintVaeEncoderStep",
    "SD3InputStep",
    "SD3LoopAfterDenoiser",
    "SD3LoopBeforeDenoiser",
    "SD3LoopDenoiser",
    "SD3PrepareLatentsStep",
    "SD3SetTimestepsStep",
    "SD3TextEncoderStep",
    "SD3VaeEncoderStep",
    "make_tiny_repo",
]
