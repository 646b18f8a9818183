"""The Stable Diffusion 3 compositions: per-stage auto blocks and StableDiffusion3AutoBlocks."""

from __future__ import annotations

from blocks.common.workflows import IMAGE2IMAGE, INPAINTING, TEXT2IMAGE, ChosenByInputs, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import (
    StableDiffusion3Img2ImgPrepareLatentsStep,
    StableDiffusion3InpaintPrepareLatentsStep,
    StableDiffusion3InpaintPrepareMaskLatentsStep,
    StableDiffusion3PrepareLatentsStep,
)
from .checks import (
    StableDiffusion3CheckInputsStep,
    StableDiffusion3Img2ImgCheckInputsStep,
    StableDiffusion3InpaintCheckInputsStep,
)
from .decoders import StableDiffusion3DecodeStep, StableDiffusion3InpaintDecodeStep
from .denoise import StableDiffusion3DenoiseStep, StableDiffusion3InpaintDenoiseStep
from .encoders import StableDiffusion3TextEncoderStep
from .image_encoders import StableDiffusion3InpaintVaeEncoderStep, StableDiffusion3VaeEncoderStep
from .inputs import StableDiffusion3InputStep
from .timesteps import StableDiffusion3Img2ImgSetTimestepsStep, StableDiffusion3SetTimestepsStep

__all__ = [
    "StableDiffusion3AutoCheckInputsStep",
    "StableDiffusion3AutoVaeEncoderStep",
    "StableDiffusion3BeforeDenoiseStep",
    "StableDiffusion3Img2ImgBeforeDenoiseStep",
    "StableDiffusion3InpaintBeforeDenoiseStep",
    "StableDiffusion3AutoBeforeDenoiseStep",
    "StableDiffusion3AutoDenoiseStep",
    "StableDiffusion3AutoDecodeStep",
    "StableDiffusion3AutoBlocks",
]


class StableDiffusion3AutoCheckInputsStep(ChosenByInputs):
    """Check the inputs of inpainting, image-to-image or text-to-image before any model runs."""

    block_classes = [
        StableDiffusion3InpaintCheckInputsStep,
        StableDiffusion3Img2ImgCheckInputsStep,
        StableDiffusion3CheckInputsStep,
    ]
    block_names = ["inpaint_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Input checks before any model runs"


class StableDiffusion3AutoVaeEncoderStep(ChosenByInputs):
    """Encode the image (and prepare the mask) for inpainting, or the reference image for image-to-image."""

    block_classes = [StableDiffusion3InpaintVaeEncoderStep, StableDiffusion3VaeEncoderStep]
    block_names = ["inpaint_vae_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["mask_image", "image"]
    summary = "VAE encoding"


class StableDiffusion3BeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: prepare_latents (initial noise), then set_timesteps (mu from the latents)."""

    block_classes = [StableDiffusion3PrepareLatentsStep, StableDiffusion3SetTimestepsStep]
    block_names = ["prepare_latents", "set_timesteps"]


class StableDiffusion3Img2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image preparation: set_timesteps (cut by strength), then prepare_latents (noised image)."""

    block_classes = [StableDiffusion3Img2ImgSetTimestepsStep, StableDiffusion3Img2ImgPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class StableDiffusion3InpaintBeforeDenoiseStep(SequentialPipelineBlocks):
    """Inpainting preparation: set_timesteps (cut by strength), prepare_latents, then the mask latents."""

    block_classes = [
        StableDiffusion3Img2ImgSetTimestepsStep,
        StableDiffusion3InpaintPrepareLatentsStep,
        StableDiffusion3InpaintPrepareMaskLatentsStep,
    ]
    block_names = ["set_timesteps", "prepare_latents", "prepare_mask_latents"]


class StableDiffusion3AutoBeforeDenoiseStep(ChosenByInputs):
    """Choose the preparation for inpainting, image-to-image or text-to-image."""

    block_classes = [
        StableDiffusion3InpaintBeforeDenoiseStep,
        StableDiffusion3Img2ImgBeforeDenoiseStep,
        StableDiffusion3BeforeDenoiseStep,
    ]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Preparation before denoising"


class StableDiffusion3AutoDenoiseStep(ChosenByInputs):
    """Choose the inpainting loop (with a mask) or the plain loop."""

    block_classes = [StableDiffusion3InpaintDenoiseStep, StableDiffusion3DenoiseStep]
    block_names = ["inpaint_denoise", "denoise"]
    block_trigger_inputs = ["mask_image", None]
    summary = "The denoising loop"


class StableDiffusion3AutoDecodeStep(ChosenByInputs):
    """Choose inpainting's decode (with a mask) or the plain one."""

    block_classes = [StableDiffusion3InpaintDecodeStep, StableDiffusion3DecodeStep]
    block_names = ["inpaint_decode", "decode"]
    block_trigger_inputs = ["mask_image", None]
    summary = "Decoding"


class StableDiffusion3AutoBlocks(FamilyBlocks):
    """Stable Diffusion 3 / 3.5: text-to-image, image-to-image and inpainting, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``inpainting``: needs ``mask_image``, ``image`` and ``prompt``
    """

    block_classes = [
        StableDiffusion3AutoCheckInputsStep,
        StableDiffusion3TextEncoderStep,
        StableDiffusion3InputStep,
        StableDiffusion3AutoVaeEncoderStep,
        StableDiffusion3AutoBeforeDenoiseStep,
        StableDiffusion3AutoDenoiseStep,
        StableDiffusion3AutoDecodeStep,
    ]
    _workflow_map = {"text2image": TEXT2IMAGE, "image2image": IMAGE2IMAGE, "inpainting": INPAINTING}

    description = (
        "Stable Diffusion 3 / 3.5: text-to-image with a prompt, image-to-image with an image (strength 0.6 by "
        "default), inpainting with an image and a mask_image."
    )
