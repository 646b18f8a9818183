"""Flux.2 as modular blocks: text-to-image, and editing with reference images; FLUX.2 and FLUX.2 Klein.

``Flux2AutoBlocks`` picks the workflow from the inputs given (``image``, one or a list of reference
images, for editing); ``Flux2KleinBaseAutoBlocks`` does the same for Klein (a Qwen3 text encoder, true
classifier-free guidance). ``FAMILY`` registers them for the classic ``Flux2Pipeline`` and
``Flux2KleinPipeline`` repos (entry point group ``modular.blocks``).
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import Flux2GuidanceStep, Flux2PrepareLatentsStep
    from .checks import Flux2CheckInputsStep, Flux2EditCheckInputsStep
    from .decoders import Flux2DecodeStep, Flux2KleinDecodeStep
    from .denoise import (
        Flux2DenoiseLoopWrapper,
        Flux2DenoiseStep,
        Flux2LoopAfterDenoiser,
        Flux2LoopBeforeDenoiser,
        Flux2LoopDenoiser,
    )
    from .encoders import Flux2TextEncoderStep, Flux2VaeEncoderStep
    from .inputs import Flux2InputStep
    from .klein_blocks import Flux2KleinBaseAutoBlocks, Flux2KleinBeforeDenoiseStep
    from .klein_denoise import Flux2KleinDenoiseStep, Flux2KleinLoopDenoiser
    from .klein_encoders import Flux2KleinInputStep, Flux2KleinTextEncoderStep
    from .modular_blocks import (
        Flux2AutoBlocks,
        Flux2AutoCheckInputsStep,
        Flux2AutoVaeEncoderStep,
        Flux2BeforeDenoiseStep,
    )
    from .timesteps import Flux2SetTimestepsStep
    from .tiny import make_tiny_repo, make_tiny_tokenizer
    from .tiny_klein import make_tiny_klein_repo

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)


def _blocks_for_classic_index(index: Mapping[str, Any]) -> type:
    """A Flux2KleinPipeline repo gets the Klein blocks; everything else the FLUX.2 ones."""
    from .klein_blocks import Flux2KleinBaseAutoBlocks
    from .modular_blocks import Flux2AutoBlocks

    return Flux2KleinBaseAutoBlocks if index.get("_class_name") == "Flux2KleinPipeline" else Flux2AutoBlocks


FAMILY = BlockFamily(
    name="flux2",
    blocks_class="blocks.flux2.modular_blocks.Flux2AutoBlocks",
    classic_pipelines=("Flux2Pipeline", "Flux2KleinPipeline"),
    variants=("blocks.flux2.klein_blocks.Flux2KleinBaseAutoBlocks",),
    choose_blocks=_blocks_for_classic_index,
    # The classic default is 1024 px; the tiny repo's images are 32 px.
    tiny_repo_inputs={"height": 32, "width": 32},
    make_tiny_repo="blocks.flux2.tiny.make_tiny_repo",
    peer_pipeline_class="Flux2ModularPipeline",
    # The peer splits Klein in two: its Flux2KleinBaseAutoBlocks guide with a guider (as ours do), and read
    # is_distilled as ours do; its Flux2KleinAutoBlocks are for distilled repos only.
    peer_pipeline_classes={"Flux2KleinBaseAutoBlocks": "Flux2KleinBaseModularPipeline"},
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
    "Flux2KleinBaseAutoBlocks",
    "Flux2KleinBeforeDenoiseStep",
    "Flux2KleinDecodeStep",
    "Flux2KleinDenoiseStep",
    "Flux2KleinInputStep",
    "Flux2KleinLoopDenoiser",
    "Flux2KleinTextEncoderStep",
    "Flux2LoopAfterDenoiser",
    "Flux2LoopBeforeDenoiser",
    "Flux2LoopDenoiser",
    "Flux2PrepareLatentsStep",
    "Flux2SetTimestepsStep",
    "Flux2TextEncoderStep",
    "Flux2VaeEncoderStep",
    "make_tiny_klein_repo",
    "make_tiny_repo",
    "make_tiny_tokenizer",
]
