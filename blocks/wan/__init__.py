"""Wan 2.1 / 2.2 as modular blocks: text-to-video and image-to-video, with one transformer or two experts.

Each workflow is a blocks class (a repo holds one: ``WanPipeline`` or ``WanImageToVideoPipeline``), chosen
from the repo's index: ``WanBlocks`` / ``Wan22Blocks`` for text-to-video, ``WanImage2VideoAutoBlocks`` /
``Wan22Image2VideoBlocks`` for image-to-video, the Wan 2.2 names for repos with a ``boundary_ratio`` (two
experts: ``transformer`` for high noise, ``transformer_2`` for low noise). ``FAMILY`` registers them
(entry point group ``modular.blocks``).
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import WanImage2VideoPrepareLatentsStep, WanPrepareLatentsStep
    from .checks import WanCheckInputsStep, WanImage2VideoCheckInputsStep
    from .decoders import WanDecodeStep, WanImage2VideoDecodeStep
    from .denoise import (
        WanDenoiseLoopWrapper,
        WanDenoiseStep,
        WanImage2VideoDenoiseStep,
        WanImage2VideoLoopBeforeDenoiser,
        WanImage2VideoLoopDenoiser,
        WanLoopAfterDenoiser,
        WanLoopBeforeDenoiser,
        WanLoopDenoiser,
    )
    from .encoders import WanImageEncoderStep, WanTextEncoderStep
    from .inputs import WanImage2VideoInputStep, WanInputStep
    from .modular_blocks import (
        Wan22Blocks,
        Wan22Image2VideoBlocks,
        WanBeforeDenoiseStep,
        WanBlocks,
        WanImage2VideoAutoBlocks,
        WanImage2VideoBeforeDenoiseStep,
    )
    from .timesteps import WanSetTimestepsStep
    from .tiny import make_tiny_repo
    from .video import export_video

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)


def _blocks_for_classic_index(index: Mapping[str, Any]) -> type:
    """The workflow's blocks, by the index's pipeline class and boundary_ratio (``choose_blocks``)."""
    from .modular_blocks import choose_blocks

    return choose_blocks(index)


_BLOCKS = "blocks.wan.modular_blocks."

FAMILY = BlockFamily(
    name="wan",
    blocks_class=_BLOCKS + "Wan22Blocks",
    classic_pipelines=("WanPipeline", "WanImageToVideoPipeline"),
    # The classic defaults are 81 frames of 480x832; the tiny transformer's rope covers 32 positions.
    tiny_repo_inputs={"height": 32, "width": 32, "num_frames": 5},
    make_tiny_repo="blocks.wan.tiny.make_tiny_repo",
    variants=(
        _BLOCKS + "WanBlocks",
        _BLOCKS + "WanImage2VideoAutoBlocks",
        _BLOCKS + "Wan22Image2VideoBlocks",
    ),
    choose_blocks=_blocks_for_classic_index,
    peer_pipeline_class="Wan22ModularPipeline",
    peer_pipeline_classes={
        "WanBlocks": "WanModularPipeline",
        "Wan22Blocks": "Wan22ModularPipeline",
        "WanImage2VideoAutoBlocks": "WanImage2VideoModularPipeline",
        "Wan22Image2VideoBlocks": "Wan22Image2VideoModularPipeline",
    },
    lora_loader="diffusers.loaders.WanLoraLoaderMixin",
    lora_options=("load_into_transformer_2",),  # a LoRA for the low-noise expert
    workflows=("text2video",),
)

__all__ = [
    "FAMILY",
    "Wan22Blocks",
    "Wan22Image2VideoBlocks",
    "WanBeforeDenoiseStep",
    "WanBlocks",
    "WanCheckInputsStep",
    "WanDecodeStep",
    "WanDenoiseLoopWrapper",
    "WanDenoiseStep",
    "WanImage2VideoAutoBlocks",
    "WanImage2VideoBeforeDenoiseStep",
    "WanImage2VideoCheckInputsStep",
    "WanImage2VideoDecodeStep",
    "WanImage2VideoDenoiseStep",
    "WanImage2VideoInputStep",
    "WanImage2VideoLoopBeforeDenoiser",
    "WanImage2VideoLoopDenoiser",
    "WanImage2VideoPrepareLatentsStep",
    "WanImageEncoderStep",
    "WanInputStep",
    "WanLoopAfterDenoiser",
    "WanLoopBeforeDenoiser",
    "WanLoopDenoiser",
    "WanPrepareLatentsStep",
    "WanSetTimestepsStep",
    "WanTextEncoderStep",
    "export_video",
    "make_tiny_repo",
]
