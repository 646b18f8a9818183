"""Stable Diffusion XL as modular blocks: text-to-image, image-to-image, inpainting, and the refiner.

``StableDiffusionXLAutoBlocks`` picks the workflow from the inputs given (``image`` for image-to-image,
``image`` and ``mask_image`` for inpainting).
``StableDiffusionXLRefinerBlocks`` serves refiner-style repos (``text_encoder_2`` only). ``FAMILY``
registers the auto blocks for the classic ``StableDiffusionXL*Pipeline`` repos (entry point group
``modular.blocks``).
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
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
    from .denoise import (
        StableDiffusionXLDenoiseStep,
        StableDiffusionXLInpaintDenoiseStep,
        StableDiffusionXLInpaintLoopAfterDenoiser,
        StableDiffusionXLInpaintLoopBeforeDenoiser,
        StableDiffusionXLLoopAfterDenoiser,
        StableDiffusionXLLoopBeforeDenoiser,
        StableDiffusionXLLoopDenoiser,
    )
    from .encoders import (
        StableDiffusionXLInpaintVaeEncoderStep,
        StableDiffusionXLRefinerTextEncoderStep,
        StableDiffusionXLTextEncoderStep,
        StableDiffusionXLVaeEncoderStep,
    )
    from .inputs import StableDiffusionXLInputStep
    from .modular_blocks import (
        StableDiffusionXLAutoBeforeDenoiseStep,
        StableDiffusionXLAutoBlocks,
        StableDiffusionXLAutoCheckInputsStep,
        StableDiffusionXLAutoDenoiseStep,
        StableDiffusionXLAutoVaeEncoderStep,
        StableDiffusionXLBeforeDenoiseStep,
        StableDiffusionXLImg2ImgBeforeDenoiseStep,
        StableDiffusionXLInpaintBeforeDenoiseStep,
        StableDiffusionXLRefinerBlocks,
    )
    from .timesteps import (
        StableDiffusionXLImg2ImgSetTimestepsStep,
        StableDiffusionXLInpaintSetTimestepsStep,
        StableDiffusionXLSetTimestepsStep,
    )
    from .tiny import make_tiny_repo

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)


def _blocks_for_classic_index(index: Mapping[str, Any]) -> type:
    """A refiner repo has no first text encoder; everything else gets the auto blocks."""
    from .modular_blocks import StableDiffusionXLAutoBlocks, StableDiffusionXLRefinerBlocks

    text_encoder = index.get("text_encoder")
    if text_encoder is None or list(text_encoder)[:2] == [None, None]:
        return StableDiffusionXLRefinerBlocks
    return StableDiffusionXLAutoBlocks


FAMILY = BlockFamily(
    name="stable-diffusion-xl",
    blocks_class="blocks.stable_diffusion_xl.modular_blocks.StableDiffusionXLAutoBlocks",
    classic_pipelines=(
        "StableDiffusionXLPipeline",
        "StableDiffusionXLImg2ImgPipeline",
        "StableDiffusionXLInpaintPipeline",
    ),
    make_tiny_repo="blocks.stable_diffusion_xl.tiny.make_tiny_repo",
    variants=("blocks.stable_diffusion_xl.modular_blocks.StableDiffusionXLRefinerBlocks",),
    choose_blocks=_blocks_for_classic_index,
    peer_pipeline_class="StableDiffusionXLModularPipeline",
    lora_loader="diffusers.loaders.StableDiffusionXLLoraLoaderMixin",
    ip_adapter_loader="diffusers.loaders.ModularIPAdapterMixin",
    workflows=("text2image", "image2image", "inpainting"),
)

__all__ = [
    "FAMILY",
    "StableDiffusionXLAutoBeforeDenoiseStep",
    "StableDiffusionXLAutoBlocks",
    "StableDiffusionXLAutoCheckInputsStep",
    "StableDiffusionXLAutoDenoiseStep",
    "StableDiffusionXLAutoVaeEncoderStep",
    "StableDiffusionXLBeforeDenoiseStep",
    "StableDiffusionXLCheckInputsStep",
    "StableDiffusionXLDecodeStep",
    "StableDiffusionXLDenoiseStep",
    "StableDiffusionXLImg2ImgBeforeDenoiseStep",
    "StableDiffusionXLImg2ImgCheckInputsStep",
    "StableDiffusionXLImg2ImgPrepareAdditionalConditioningStep",
    "StableDiffusionXLImg2ImgPrepareLatentsStep",
    "StableDiffusionXLImg2ImgSetTimestepsStep",
    "StableDiffusionXLInpaintBeforeDenoiseStep",
    "StableDiffusionXLInpaintCheckInputsStep",
    "StableDiffusionXLInpaintDenoiseStep",
    "StableDiffusionXLInpaintLoopAfterDenoiser",
    "StableDiffusionXLInpaintLoopBeforeDenoiser",
    "StableDiffusionXLInpaintPrepareLatentsStep",
    "StableDiffusionXLInpaintSetTimestepsStep",
    "StableDiffusionXLInpaintVaeEncoderStep",
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
