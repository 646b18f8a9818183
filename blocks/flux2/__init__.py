"""Flux.2 as modular blocks: text-to-image, and editing with reference images.

``Flux2AutoBlocks`` picks the workflow from the inputs given (``image``, one or a list of reference
images, for editing). ``FAMILY`` registers the blocks for the classic ``Flux2Pipeline`` repos (entry point
group ``modular.blocks``).
"""

from typing import TYPE_CHECKING

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import Flux2GuidanceStep, Flux2PrepareLatentsStep
    from .checks import Flux2CheckInputsStep, Flux2EditCheckInputsStep
    from .decoders import Flux2DecodeStep
    from .denoise import (
        Flux2DenoiseLoopWrapper,
        Flux2DenoiseStep,
        Flux2LoopAfterDenoiser,
        Flux2LoopBeforeDenoiser,
        Flux2LoopDenoiser,
    )
    from .encoders import Flux2TextEncoderStep, Flux2VaeEncoderStep
    from .inputs import Flux2InputStep
    from .modular_blocks import (
        Flux2AutoBlocks,
        Flux2AutoCheckInputsStep,
        Flux2AutoVaeEncoderStep,
        Flux2BeforeDenoiseStep,
    )
    from .timesteps import Flux2SetTimestepsStep
    from .tiny import make_tiny_repo, make_tiny_tokenizer

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

FAMILY = BlockFamily(
    name="flux2",
    blocks_class="blocks.flux2.modular_blocks.Flux2AutoBlocks",
    classic_pipelines=("Flux2Pipeline",),
    # The classic default is 1024 px; the tiny repo's images are 32 px.
    tiny_repo_inputs={"height": 32, "width": 32},
    make_tiny_repo="blocks.flux2.tiny.make_tiny_repo",
    peer_pipeline_class="Flux2ModularPipeline",
    lora_loader="diffusers.loaders.Flux2LoraLoaderMixin",
    workflows=("text2image", "image_conditioned"),
)

__all__ = [
    "FAMILY",
    "Flux2AutoBlocks",
    "Flux2AutoCheckInputsStep",
    "Flux2AutoVaeEncoderStep",
    "Flux2BeforeDenoiseStep",
    "Flux2CheckInputsStep",
    "Flux2DecodeStep",
    "Flux2DenoiseLoopWrapper",
    "Flux2DenoiseStep",
    "Flux2EditCheckInputsStep",
    "Flux2GuidanceStep",
    "Flux2InputStep",
    "Flux2LoopAfterDenoiser",
    "Flux2LoopBeforeDenoiser",
    "Flux2LoopDenoiser",
    "Flux2PrepareLatentsStep",
    "Flux2SetTimestepsStep",
    "Flux2TextEncoderStep",
    "Flux2VaeEncoderStep",
    "make_tiny_repo",
    "make_tiny_tokenizer",
]
