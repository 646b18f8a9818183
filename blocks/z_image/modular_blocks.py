"""The Z-Image compositions: per-stage auto blocks and ZImageAutoBlocks."""

from __future__ import annotations

from blocks.common.workflows import IMAGE2IMAGE, TEXT2IMAGE, ChosenByInputs, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import ZImageImg2ImgPrepareLatentsStep, ZImagePrepareLatentsStep
from .checks import ZImageCheckInputsStep, ZImageImg2ImgCheckInputsStep
from .decoders import ZImageDecodeStep
from .denoise import ZImageDenoiseStep
from .encoders import ZImageTextEncoderStep, ZImageVaeEncoderStep
from .inputs import ZImageInputStep
from .timesteps import ZImageImg2ImgSetTimestepsStep, ZImageSetTimestepsStep

__all__ = [
    "ZImageAutoCheckInputsStep",
    "ZImageAutoVaeEncoderStep",
    "ZImageBeforeDenoiseStep",
    "ZImageImg2ImgBeforeDenoiseStep",
    "ZImageAutoBeforeDenoiseStep",
    "ZImageAutoBlocks",
]


class ZImageAutoCheckInputsStep(ChosenByInputs):
    """Check the inputs of image-to-image or text-to-image before any model runs."""

    block_classes = [ZImageImg2ImgCheckInputsStep, ZImageCheckInputsStep]
    block_names = ["img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["image", None]
    summary = "Input checks before any model runs"


class ZImageAutoVaeEncoderStep(ChosenByInputs):
    """Encode the reference image when one is given."""

    block_classes = [ZImageVaeEncoderStep]
    block_names = ["img2img_vae_encoder"]
    block_trigger_inputs = ["image"]
    summary = "VAE encoding of the reference image"


class ZImageBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: set_timesteps, then prepare_latents (initial noise)."""

    block_classes = [ZImageSetTimestepsStep, ZImagePrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class ZImageImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image preparation: set_timesteps (cut by strength), then prepare_latents (noised image)."""

    block_classes = [ZImageImg2ImgSetTimestepsStep, ZImageImg2ImgPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class ZImageAutoBeforeDenoiseStep(ChosenByInputs):
    """Choose the preparation for image-to-image or text-to-image."""

    block_classes = [ZImageImg2ImgBeforeDenoiseStep, ZImageBeforeDenoiseStep]
    block_names = ["img2img", "text2img"]
    block_trigger_inputs = ["image", None]
    summary = "Preparation before denoising"


class ZImageAutoBlocks(FamilyBlocks):
    """Z-Image: text-to-image and image-to-image, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
    """

    block_classes = [
        ZImageAutoCheckInputsStep,
        ZImageTextEncoderStep,
        ZImageInputStep,
        ZImageAutoVaeEncoderStep,
        ZImageAutoBeforeDenoiseStep,
        ZImageDenoiseStep,
        ZImageDecodeStep,
    ]
    _workflow_map = {"text2image": TEXT2IMAGE, "image2image": IMAGE2IMAGE}

    description = (
        "Z-Image: text-to-image with a prompt, image-to-image with an image (strength 0.6 by default)."
    )
