"""The Stable Diffusion 3 compositions: per-stage auto blocks and SD3AutoBlocks."""

from __future__ import annotations

from blocks.common.workflows import IMAGE2IMAGE, INPAINTING, TEXT2IMAGE, ChosenByInputs, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import (
    SD3Img2ImgPrepareLatentsStep,
    SD3InpaintPrepareLatentsStep,
    SD3InpaintPrepareMaskLatentsStep,
    SD3PrepareLatentsStep,
)
from .checks import SD3CheckInputsStep, SD3Img2ImgCheckInputsStep, SD3InpaintCheckInputsStep
from .decoders import SD3DecodeStep, SD3InpaintDecodeStep
from .denoise import SD3DenoiseStep, SD3InpaintDenoiseStep
from .encoders import SD3TextEncoderStep
from .image_encoders import SD3InpaintVaeEncoderStep, SD3VaeEncoderStep
from .inputs import SD3InputStep
from .timesteps import SD3Img2ImgSetTimestepsStep, SD3SetTimestepsStep

__all__ = [
    "SD3AutoCheckInputsStep",
    "SD3AutoVaeEncoderStep",
    "SD3BeforeDenoiseStep",
    "SD3Img2ImgBeforeDenoiseStep",
    "SD3InpaintBeforeDenoiseStep",
    "SD3AutoBeforeDenoiseStep",
    "SD3AutoDenoiseStep",
    "SD3AutoDecodeStep",
    "SD3AutoBlocks",
]


class SD3AutoCheckInputsStep(ChosenByInputs):
    """Check the inputs of inpainting, image-to-image or text-to-image before any model runs."""

    block_classes = [SD3InpaintCheckInputsStep, SD3Img2ImgCheckInputsStep, SD3CheckInputsStep]
    block_names = ["inpaint_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Input checks before any model runs"


class SD3AutoVaeEncoderStep(ChosenByInputs):
    """Encode the image (and prepare the mask) for inpainting, or the reference image for image-to-image."""

    block_classes = [SD3InpaintVaeEncoderStep, SD3VaeEncoderStep]
    block_names = ["inpaint_vae_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["mask_image", "image"]
    summary = "VAE encoding"


class SD3BeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: prepare_latents (initial noise), then set_timesteps (mu from the latents)."""

    block_classes = [SD3PrepareLatentsStep, SD3SetTimestepsStep]
    block_names = ["prepare_latents", "set_timesteps"]


class SD3Img2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image preparation: set_timesteps (cut by strength), then prepare_latents (noised image)."""

    block_classes = [SD3Img2ImgSetTimestepsStep, SD3Img2ImgPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class SD3InpaintBeforeDenoiseStep(SequentialPipelineBlocks):
    """Inpainting preparation: set_timesteps (cut by strength), prepare_latents, then the mask latents."""

    block_classes = [
        SD3Img2ImgSetTimestepsStep,
        SD3InpaintPrepareLatentsStep,
        SD3InpaintPrepareMaskLatentsStep,
    ]
    block_names = ["set_timesteps", "prepare_latents", "prepare_mask_latents"]


class SD3AutoBeforeDenoiseStep(ChosenByInputs):
    """Choose the preparation for inpainting, image-to-image or text-to-image."""

    block_classes = [SD3InpaintBeforeDenoiseStep, SD3Img2ImgBeforeDenoiseStep, SD3BeforeDenoiseStep]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Preparation before denoising"


class SD3AutoDenoiseStep(ChosenByInputs):
    """Choose the inpainting loop (with a mask) or the plain loop."""

    block_classes = [SD3InpaintDenoiseStep, SD3DenoiseStep]
    block_names = ["inpaint_denoise", "denoise"]
    block_trigger_inputs = ["mask_image", None]
    summary = "The denoising loop"


class SD3AutoDecodeStep(ChosenByInputs):
    """Choose inpainting's decode (with a mask) or the plain one."""

    block_classes = [SD3InpaintDecodeStep, SD3DecodeStep]
    block_names = ["inpaint_decode", "decode"]
    block_trigger_inputs = ["mask_image", None]
    summary = "Decoding"


class SD3AutoBlocks(FamilyBlocks):
    """Stable Diffusion 3 / 3.5: text-to-image, image-to-image and inpainting, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``inpainting``: needs ``mask_image``, ``image`` and ``prompt``
    """

    block_classes = [
        SD3AutoCheckInputsStep,
        SD3TextEncoderStep,
        SD3InputStep,
        SD3AutoVaeEncoderStep,
        SD3AutoBeforeDenoiseStep,
        SD3AutoDenoiseStep,
        SD3AutoDecodeStep,
    ]
    _workflow_map = {"text2image": TEXT2IMAGE, "image2image": IMAGE2IMAGE, "inpainting": INPAINTING}

    description = (
        "Stable Diffusion 3 / 3.5: text-to-image with a prompt, image-to-image with an image (strength 0.6 by "
        "default), inpainting with an image and a mask_image."
    )
