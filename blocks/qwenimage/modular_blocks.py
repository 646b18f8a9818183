"""The Qwen-Image compositions: per-stage auto blocks, QwenImageAutoBlocks (text-to-image, image-to-image,
inpainting) and QwenImageEditAutoBlocks (edit)."""

from __future__ import annotations

from blocks.common.workflows import IMAGE2IMAGE, INPAINTING, TEXT2IMAGE, ChosenByInputs, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import (
    QwenImageEditPrepareLatentsStep,
    QwenImagePrepareLatentsStep,
    QwenImageSetTimestepsStep,
)
from .checks import (
    QwenImageCheckInputsStep,
    QwenImageEditCheckInputsStep,
    QwenImageImg2ImgCheckInputsStep,
    QwenImageInpaintCheckInputsStep,
)
from .decoders import QwenImageDecodeStep
from .denoise import QwenImageDenoiseStep, QwenImageEditDenoiseStep, QwenImageInpaintDenoiseStep
from .encoders import QwenImageEditTextEncoderStep, QwenImageTextEncoderStep
from .encoders_edit import QwenImageEditResizeStep, QwenImageEditVaeEncoderStep
from .encoders_image import QwenImageInpaintMaskStep, QwenImageInpaintVaeEncoderStep, QwenImageVaeEncoderStep
from .inputs import QwenImageEditInputStep, QwenImageInputStep
from .strength import (
    QwenImageImg2ImgPrepareLatentsStep,
    QwenImageImg2ImgSetTimestepsStep,
    QwenImageInpaintPrepareLatentsStep,
)

__all__ = [
    "EDIT",
    "QwenImageAutoCheckInputsStep",
    "QwenImageAutoVaeEncoderStep",
    "QwenImageInpaintVaeEncoderStage",
    "QwenImageBeforeDenoiseStep",
    "QwenImageImg2ImgBeforeDenoiseStep",
    "QwenImageInpaintBeforeDenoiseStep",
    "QwenImageAutoBeforeDenoiseStep",
    "QwenImageAutoDenoiseStep",
    "QwenImageEditBeforeDenoiseStep",
    "QwenImageAutoBlocks",
    "QwenImageEditAutoBlocks",
]

EDIT = {"image": True, "prompt": True}


class QwenImageAutoCheckInputsStep(ChosenByInputs):
    """Check the inputs of inpainting, image-to-image or text-to-image before any model runs."""

    block_classes = [
        QwenImageInpaintCheckInputsStep,
        QwenImageImg2ImgCheckInputsStep,
        QwenImageCheckInputsStep,
    ]
    block_names = ["inpaint_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Input checks before any model runs"


class QwenImageInpaintVaeEncoderStage(SequentialPipelineBlocks):
    """Inpainting's encoding: the reference image's latents, then the packed mask."""

    block_classes = [QwenImageInpaintVaeEncoderStep, QwenImageInpaintMaskStep]
    block_names = ["vae_encoder", "mask"]


class QwenImageAutoVaeEncoderStep(ChosenByInputs):
    """Encode the reference image (and the mask for inpainting) when one is given."""

    block_classes = [QwenImageInpaintVaeEncoderStage, QwenImageVaeEncoderStep]
    block_names = ["inpaint_vae_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["mask_image", "image"]
    summary = "VAE encoding of the reference image"


class QwenImageBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: prepare_latents (packed noise), then set_timesteps (shifted by its length)."""

    block_classes = [QwenImagePrepareLatentsStep, QwenImageSetTimestepsStep]
    block_names = ["prepare_latents", "set_timesteps"]


class QwenImageImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image preparation: set_timesteps (cut by strength), then prepare_latents (noised image)."""

    block_classes = [QwenImageImg2ImgSetTimestepsStep, QwenImageImg2ImgPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class QwenImageInpaintBeforeDenoiseStep(SequentialPipelineBlocks):
    """Inpainting preparation: set_timesteps (cut by strength), then prepare_latents (noised image, noise)."""

    block_classes = [QwenImageImg2ImgSetTimestepsStep, QwenImageInpaintPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class QwenImageAutoBeforeDenoiseStep(ChosenByInputs):
    """Choose the preparation for inpainting, image-to-image or text-to-image."""

    block_classes = [
        QwenImageInpaintBeforeDenoiseStep,
        QwenImageImg2ImgBeforeDenoiseStep,
        QwenImageBeforeDenoiseStep,
    ]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Preparation before denoising"


class QwenImageAutoDenoiseStep(ChosenByInputs):
    """Choose the denoising loop: inpainting's keeps the image outside the mask."""

    block_classes = [QwenImageInpaintDenoiseStep, QwenImageDenoiseStep]
    block_names = ["inpaint_denoise", "denoise"]
    block_trigger_inputs = ["mask_image", None]
    summary = "The denoising loop"


class QwenImageEditBeforeDenoiseStep(SequentialPipelineBlocks):
    """Edit preparation: prepare_latents (packed noise, both images' shapes), then set_timesteps."""

    block_classes = [QwenImageEditPrepareLatentsStep, QwenImageSetTimestepsStep]
    block_names = ["prepare_latents", "set_timesteps"]


class QwenImageAutoBlocks(FamilyBlocks):
    """Qwen-Image: text-to-image, image-to-image and inpainting, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``inpainting``: needs ``mask_image``, ``image`` and ``prompt``
    """

    block_classes = [
        QwenImageAutoCheckInputsStep,
        QwenImageTextEncoderStep,
        QwenImageInputStep,
        QwenImageAutoVaeEncoderStep,
        QwenImageAutoBeforeDenoiseStep,
        QwenImageAutoDenoiseStep,
        QwenImageDecodeStep,
    ]
    _workflow_map = {"text2image": TEXT2IMAGE, "image2image": IMAGE2IMAGE, "inpainting": INPAINTING}

    description = (
        "Qwen-Image: text-to-image with a prompt, image-to-image with an image, inpainting with an image and a "
        "mask (strength 0.6 by default); true classifier-free guidance with a negative prompt and "
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
