"""Z-Image as modular blocks: text-to-image and image-to-image.

``ZImageAutoBlocks`` picks the workflow from the inputs given (``image`` for image-to-image).
``FAMILY`` registers the blocks for the classic ``ZImagePipeline`` and ``ZImageImg2ImgPipeline``
repos (entry point group ``modular.blocks``).
"""

from typing import TYPE_CHECKING

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import ZImageImg2ImgPrepareLatentsStep, ZImagePrepareLatentsStep
    from .checks import ZImageCheckInputsStep, ZImageImg2ImgCheckInputsStep
    from .decoders import ZImageDecodeStep
    from .denoise import (
        ZImageDenoiseLoopWrapper,
        ZImageDenoiseStep,
        ZImageLoopAfterDenoiser,
        ZImageLoopBeforeDenoiser,
        ZImageLoopDenoiser,
    )
    from .encoders import ZImageTextEncoderStep, ZImageVaeEncoderStep
    from .inputs import ZImageInputStep
    from .modular_blocks import (
        ZImageAutoBeforeDenoiseStep,
        ZImageAutoBlocks,
        ZImageAutoCheckInputsStep,
        ZImageAutoVaeEncoderStep,
        ZImageBeforeDenoiseStep,
        ZImageImg2ImgBeforeDenoiseStep,
    )
    from .timesteps import ZImageImg2ImgSetTimestepsStep, ZImageSetTimestepsStep
    from .tiny import make_tiny_repo, make_tiny_tokenizer

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

FAMILY = BlockFamily(
    name="z-image",
    blocks_class="blocks.z_image.modular_blocks.ZImageAutoBlocks",
    classic_pipelines=("ZImagePipeline", "ZImageImg2ImgPipeline"),
    # The classic default is 1024 px; the tiny transformer's rope tables cover 32 positions per side.
    tiny_repo_inputs={"height": 32, "width": 32},
    make_tiny_repo="blocks.z_image.tiny.make_tiny_repo",
    peer_pipeline_class="ZImageModularPipeline",
    lora_loader="diffusers.loaders.ZImageLoraLoaderMixin",
    workflows=("text2image", "image2image"),
)

__all__ = [
    "FAMILY",
    "ZImageAutoBeforeDenoiseStep",
    "ZImageAutoBlocks",
    "ZImageAutoCheckInputsStep",
    "ZImageAutoVaeEncoderStep",
    "ZImageBeforeDenoiseStep",
    "ZImageCheckInputsStep",
    "ZImageDecodeStep",
    "ZImageDenoiseLoopWrapper",
    "ZImageDenoiseStep",
    "ZImageImg2ImgBeforeDenoiseStep",
    "ZImageImg2ImgCheckInputsStep",
    "ZImageImg2ImgPrepareLatentsStep",
    "ZImageImg2ImgSetTimestepsStep",
    "ZImageInputStep",
    "ZImageLoopAfterDenoiser",
    "ZImageLoopBeforeDenoiser",
    "ZImageLoopDenoiser",
    "ZImagePrepareLatentsStep",
    "ZImageSetTimestepsStep",
    "ZImageTextEncoderStep",
    "ZImageVaeEncoderStep",
    "make_tiny_repo",
    "make_tiny_tokenizer",
]
