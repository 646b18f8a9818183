"""Qwen-Image as modular blocks: text-to-image, and edit (Qwen-Image-Edit).

``QwenImageAutoBlocks`` serves ``QwenImagePipeline`` repos, ``QwenImageEditAutoBlocks`` serves
``QwenImageEditPipeline`` repos (their index names the class, and they carry a ``processor``). ``FAMILY``
registers both (entry point group ``modular.blocks``).
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modular import BlockFamily
from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .before_denoise import (
        QwenImageEditPrepareLatentsStep,
        QwenImagePrepareLatentsStep,
        QwenImageSetTimestepsStep,
    )
    from .checks import QwenImageCheckInputsStep, QwenImageEditCheckInputsStep
    from .decoders import QwenImageDecodeStep
    from .denoise import (
        QwenImageDenoiseLoopWrapper,
        QwenImageDenoiseStep,
        QwenImageEditDenoiseStep,
        QwenImageEditLoopBeforeDenoiser,
        QwenImageLoopAfterDenoiser,
        QwenImageLoopBeforeDenoiser,
        QwenImageLoopDenoiser,
    )
    from .encoders import QwenImageEditTextEncoderStep, QwenImageTextEncoderStep
    from .encoders_edit import QwenImageEditResizeStep, QwenImageEditVaeEncoderStep
    from .inputs import QwenImageEditInputStep, QwenImageInputStep
    from .modular_blocks import (
        QwenImageAutoBlocks,
        QwenImageBeforeDenoiseStep,
        QwenImageEditAutoBlocks,
        QwenImageEditBeforeDenoiseStep,
    )
    from .tiny import make_tiny_edit_repo, make_tiny_repo, make_tiny_tokenizer

# Each name is imported on first use (PEP 562): importing the package imports none of its modules.
__getattr__, __dir__ = lazy_exports(__name__, __file__)

_EDIT_PIPELINES = ("QwenImageEditPipeline",)


def _blocks_for_classic_index(index: Mapping[str, Any]) -> type:
    """Edit blocks for a classic edit repo (its ``_class_name``), text-to-image blocks otherwise."""
    from .modular_blocks import QwenImageAutoBlocks, QwenImageEditAutoBlocks

    return QwenImageEditAutoBlocks if index.get("_class_name") in _EDIT_PIPELINES else QwenImageAutoBlocks


FAMILY = BlockFamily(
    name="qwen-image",
    blocks_class="blocks.qwenimage.modular_blocks.QwenImageAutoBlocks",
    classic_pipelines=("QwenImagePipeline", *_EDIT_PIPELINES),
    # The classic default is 1024 px; the tiny repo's image is 32 px.
    tiny_repo_inputs={"height": 32, "width": 32},
    make_tiny_repo="blocks.qwenimage.tiny.make_tiny_repo",
    variants=("blocks.qwenimage.modular_blocks.QwenImageEditAutoBlocks",),
    choose_blocks=_blocks_for_classic_index,
    peer_pipeline_class="QwenImageModularPipeline",
    lora_loader="diffusers.loaders.QwenImageLoraLoaderMixin",
    workflows=("text2image",),
)

__all__ = [
    "FAMILY",
    "QwenImageAutoBlocks",
    "QwenImageBeforeDenoiseStep",
    "QwenImageCheckInputsStep",
    "QwenImageDecodeStep",
    "QwenImageDenoiseLoopWrapper",
    "QwenImageDenoiseStep",
    "QwenImageEditAutoBlocks",
    "QwenImageEditBeforeDenoiseStep",
    "QwenImageEditCheckInputsStep",
    "QwenImageEditDenoiseStep",
    "QwenImageEditInputStep",
    "QwenImageEditLoopBeforeDenoiser",
    "QwenImageEditPrepareLatentsStep",
    "QwenImageEditResizeStep",
    "QwenImageEditTextEncoderStep",
    "QwenImageEditVaeEncoderStep",
    "QwenImageInputStep",
    "QwenImageLoopAfterDenoiser",
    "QwenImageLoopBeforeDenoiser",
    "QwenImageLoopDenoiser",
    "QwenImagePrepareLatentsStep",
    "QwenImageSetTimestepsStep",
    "QwenImageTextEncoderStep",
    "make_tiny_edit_repo",
    "make_tiny_repo",
    "make_tiny_tokenizer",
]
