"""The Qwen-Image compositions: QwenImageAutoBlocks (text-to-image) and QwenImageEditAutoBlocks (edit)."""

from __future__ import annotations

from blocks.common.workflows import TEXT2IMAGE, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import (
    QwenImageEditPrepareLatentsStep,
    QwenImagePrepareLatentsStep,
    QwenImageSetTimestepsStep,
)
from .checks import QwenImageCheckInputsStep, QwenImageEditCheckInputsStep
from .decoders import QwenImageDecodeStep
from .denoise import QwenImageDenoiseStep, QwenImageEditDenoiseStep
from .encoders import QwenImageEditTextEncoderStep, QwenImageTextEncoderStep
from .encoders_edit import QwenImageEditResizeStep, QwenImageEditVaeEncoderStep
from .inputs import QwenImageEditInputStep, QwenImageInputStep

__all__ = [
    "EDIT",
    "QwenImageBeforeDenoiseStep",
    "QwenImageEditBeforeDenoiseStep",
    "QwenImageAutoBlocks",
    "QwenImageEditAutoBlocks",
]

EDIT = {"image": True, "prompt": True}


class QwenImageBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: prepare_latents (packed noise), then set_timesteps (shifted by its length)."""

    block_classes = [QwenImagePrepareLatentsStep, QwenImageSetTimestepsStep]
    block_names = ["prepare_latents", "set_timesteps"]


class QwenImageEditBeforeDenoiseStep(SequentialPipelineBlocks):
    """Edit preparation: prepare_latents (packed noise, both images' shapes), then set_timesteps."""

    block_classes = [QwenImageEditPrepareLatentsStep, QwenImageSetTimestepsStep]
    block_names = ["prepare_latents", "set_timesteps"]


class QwenImageAutoBlocks(FamilyBlocks):
    """Qwen-Image: text-to-image.

    Supported workflows:
      - ``text2image``: needs ``prompt``
    """

    block_classes = [
        QwenImageCheckInputsStep,
        QwenImageTextEncoderStep,
        QwenImageInputStep,
        QwenImageBeforeDenoiseStep,
        QwenImageDenoiseStep,
        QwenImageDecodeStep,
    ]
    block_names = ["check_inputs", "text_encoder", "input", "before_denoise", "denoise", "decode"]
    _workflow_map = {"text2image": TEXT2IMAGE}

    description = (
        "Qwen-Image: text-to-image with a prompt; true classifier-free guidance with a negative prompt and "
        "true_cfg_scale > 1."
    )


class QwenImageEditAutoBlocks(SequentialPipelineBlocks):
    """Qwen-Image-Edit: an input image changed as the prompt says.

    Supported workflows:
      - ``edit``: needs ``image`` and ``prompt``
    """

    block_classes = [
        QwenImageEditCheckInputsStep,
        QwenImageEditResizeStep,
        QwenImageEditTextEncoderStep,
        QwenImageEditInputStep,
        QwenImageEditVaeEncoderStep,
        QwenImageEditBeforeDenoiseStep,
        QwenImageEditDenoiseStep,
        QwenImageDecodeStep,
    ]
    block_names = [
        "check_inputs",
        "resize",
        "text_encoder",
        "input",
        "vae_encoder",
        "before_denoise",
        "denoise",
        "decode",
    ]
    _workflow_map = {"edit": EDIT}

    description = (
        "Qwen-Image-Edit: the image, resized to about 1024 x 1024 pixels, goes through Qwen2.5-VL's vision tower "
        "with the prompt, and its VAE latents ride beside the latents as extra tokens; true classifier-free "
        "guidance with a negative prompt and true_cfg_scale > 1."
    )
