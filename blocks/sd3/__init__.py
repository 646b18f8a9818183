"""Stable Diffusion 3 / 3.5 as modular blocks: text-to-image, image-to-image and inpainting.

``StableDiffusion3AutoBlocks`` picks the workflow from the inputs given (``mask_image`` for inpainting, ``image`` for
image-to-image). ``FAMILY`` registers the blocks for the classic ``StableDiffusion3Pipeline``,
``StableDiffusion3Img2ImgPipeline`` and ``StableDiffusion3InpaintPipeline`` repos (entry point group
``modular.blocks``).
"""

from typing import TYPE_CHECKING

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import (
        StableDiffusion3Img2ImgPrepareLatentsStep,
        StableDiffusion3InpaintPrepareLatentsStep,
        StableDiffusion3InpaintPrepareMaskLatentsStep,
        StableDiffusion3PrepareLatentsStep,
    )
    from .checks import (
        StableDiffusion3CheckInputsStep,
        StableDiffusion3Img2ImgCheckInputsStep,
        StableDiffusion3InpaintCheckInputsStep,
    )
    from .decoders import StableDiffusion3DecodeStep, StableDiffusion3InpaintDecodeStep
    from .denoise import (
        StableDiffusion3DenoiseLoopWrapper,
        StableDiffusion3DenoiseStep,
        StableDiffusion3InpaintDenoiseStep,
        StableDiffusion3InpaintLoopAfterDenoiser,
        StableDiffusion3InpaintLoopBeforeDenoiser,
        StableDiffusion3LoopAfterDenoiser,
        StableDiffusion3LoopBeforeDenoiser,
        StableDiffusion3LoopDenoiser,
    )
    from .encoders import StableDiffusion3TextEncoderStep
    from .image_encoders import StableDiffusion3InpaintVaeEncoderStep, StableDiffusion3VaeEncoderStep
    from .inputs import StableDiffusion3InputStep
    from .modular_blocks import (
        StableDiffusion3AutoBeforeDenoiseStep,
        StableDiffusion3AutoBlocks,
        StableDiffusion3AutoCheckInputsStep,
        StableDiffusion3AutoDecodeStep,
        StableDiffusion3AutoDenoiseStep,
        StableDiffusion3AutoVaeEncoderStep,
        StableDiffusion3BeforeDenoiseStep,
        StableDiffusion3Img2ImgBeforeDenoiseStep,
        StableDiffusion3InpaintBeforeDenoiseStep,
    )
    from .timesteps import StableDiffusion3Img2ImgSetTimestepsStep, StableDiffusion3SetTimestepsStep
    from .tiny import make_tiny_repo

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

FAMILY = BlockFamily(
    name="stable-diffusion-3",
    blocks_class="blocks.sd3.modular_blocks.StableDiffusion3AutoBlocks",
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
    "StableDiffusion3AutoBeforeDenoiseStep",
    "StableDiffusion3AutoBlocks",
    "StableDiffusion3AutoCheckInputsStep",
    "StableDiffusion3AutoDecodeStep",
    "StableDiffusion3AutoDenoiseStep",
    "StableDiffusion3AutoVaeEncoderStep",
    "StableDiffusion3BeforeDenoiseStep",
    "StableDiffusion3CheckInputsStep",
    "StableDiffusion3DecodeStep",
    "StableDiffusion3DenoiseLoopWrapper",
    "StableDiffusion3DenoiseStep",
    "StableDiffusion3Img2ImgBeforeDenoiseStep",
    "StableDiffusion3Img2ImgCheckInputsStep",
    "StableDiffusion3Img2ImgPrepareLatentsStep",
    "StableDiffusion3Img2ImgSetTimestepsStep",
    "StableDiffusion3InpaintBeforeDenoiseStep",
    "StableDiffusion3InpaintCheckInputsStep",
    "StableDiffusion3InpaintDecodeStep",
    "StableDiffusion3InpaintDenoiseStep",
    "StableDiffusion3InpaintLoopAfterDenoiser",
    "StableDiffusion3InpaintLoopBeforeDenoiser",
    "StableDiffusion3InpaintPrepareLatentsStep",
    "StableDiffusion3InpaintPrepareMaskLatentsStep",
    "StableDiffusion3InpaintVaeEncoderStep",
    "StableDiffusion3InputStep",
    "StableDiffusion3LoopAfterDenoiser",
    "StableDiffusion3LoopBeforeDenoiser",
    "StableDiffusion3LoopDenoiser",
    "StableDiffusion3PrepareLatentsStep",
    "StableDiffusion3SetTimestepsStep",
    "StableDiffusion3TextEncoderStep",
    "StableDiffusion3VaeEncoderStep",
    "make_tiny_repo",
]
