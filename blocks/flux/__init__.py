"""Flux (FLUX.1) as modular blocks: text-to-image, image-to-image and control (canny, depth).

``FluxAutoBlocks`` picks the workflow from the inputs given (``control_image`` for control, ``image``
for image-to-image). ``FAMILY`` registers the blocks for the classic ``FluxPipeline``,
``FluxImg2ImgPipeline`` and ``FluxControlPipeline`` repos (entry point group ``modular.blocks``).
"""

from typing import TYPE_CHECKING

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import (
        FluxControlPrepareLatentsStep,
        FluxGuidanceStep,
        FluxImg2ImgGuidanceStep,
        FluxImg2ImgPrepareLatentsStep,
        FluxPrepareLatentsStep,
    )
    from .decoders import FluxDecodeStep
    from .denoise import (
        FluxControlDenoiseStep,
        FluxControlLoopBeforeDenoiser,
        FluxDenoiseLoopWrapper,
        FluxDenoiseStep,
        FluxLoopAfterDenoiser,
        FluxLoopBeforeDenoiser,
        FluxLoopDenoiser,
    )
    from .encoders import FluxControlImageEncoderStep, FluxTextEncoderStep, FluxVaeEncoderStep
    from .inputs import FluxInputStep
    from .modular_blocks import (
        FluxAutoBeforeDenoiseStep,
        FluxAutoBlocks,
        FluxAutoDenoiseStep,
        FluxAutoVaeEncoderStep,
        FluxBeforeDenoiseStep,
        FluxControlBeforeDenoiseStep,
        FluxImg2ImgBeforeDenoiseStep,
    )
    from .scenario import seed_scenario
    from .timesteps import FluxImg2ImgSetTimestepsStep, FluxSetTimestepsStep
    from .tiny import make_seed_scale_repo, make_tiny_repo, make_tiny_t5_tokenizer

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

FAMILY = BlockFamily(
    name="flux",
    blocks_class="blocks.flux.modular_blocks.FluxAutoBlocks",
    classic_pipelines=("FluxPipeline", "FluxImg2ImgPipeline", "FluxControlPipeline"),
    make_tiny_repo="blocks.flux.tiny.make_tiny_repo",
    peer_pipeline_class="FluxModularPipeline",
    demo="blocks.flux.scenario.seed_scenario",
    lora_loader="diffusers.loaders.FluxLoraLoaderMixin",
    ip_adapter_loader="diffusers.loaders.FluxIPAdapterMixin",
    workflows=("text2image", "image2image", "control"),
)

__all__ = [
    "FAMILY",
    "FluxAutoBeforeDenoiseStep",
    "FluxAutoBlocks",
    "FluxAutoDenoiseStep",
    "FluxAutoVaeEncoderStep",
    "FluxBeforeDenoiseStep",
    "FluxControlBeforeDenoiseStep",
    "FluxControlDenoiseStep",
    "FluxControlImageEncoderStep",
    "FluxControlLoopBeforeDenoiser",
    "FluxControlPrepareLatentsStep",
    "FluxDecodeStep",
    "FluxDenoiseLoopWrapper",
    "FluxDenoiseStep",
    "FluxGuidanceStep",
    "FluxImg2ImgBeforeDenoiseStep",
    "FluxImg2ImgGuidanceStep",
    "FluxImg2ImgPrepareLatentsStep",
    "FluxImg2ImgSetTimestepsStep",
    "FluxInputStep",
    "FluxLoopAfterDenoiser",
    "FluxLoopBeforeDenoiser",
    "FluxLoopDenoiser",
    "FluxPrepareLatentsStep",
    "FluxSetTimestepsStep",
    "FluxTextEncoderStep",
    "FluxVaeEncoderStep",
    "make_seed_scale_repo",
    "make_tiny_repo",
    "make_tiny_t5_tokenizer",
    "seed_scenario",
]
