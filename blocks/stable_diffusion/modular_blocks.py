"""The Stable Diffusion compositions: per-stage auto blocks and StableDiffusionAutoBlocks."""

from __future__ import annotations

from blocks.common.ip_adapter import STAGES_WITH_IP_ADAPTER, IPAdapterStep
from blocks.common.workflows import IMAGE2IMAGE, INPAINTING, TEXT2IMAGE, ChosenByInputs, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import (
    StableDiffusionImg2ImgPrepareLatentsStep,
    StableDiffusionInpaintPrepareLatentsStep,
    StableDiffusionPrepareLatentsStep,
)
from .checks import (
    StableDiffusionCheckInputsStep,
    StableDiffusionImg2ImgCheckInputsStep,
    StableDiffusionInpaintCheckInputsStep,
)
from .decoders import StableDiffusionDecodeStep
from .denoise import StableDiffusionDenoiseStep, StableDiffusionInpaintDenoiseStep
from .encoders import (
    StableDiffusionInpaintVaeEncoderStep,
    StableDiffusionTextEncoderStep,
    StableDiffusionVaeEncoderStep,
)
from .inputs import StableDiffusionInputStep
from .timesteps import (
    StableDiffusionImg2ImgSetTimestepsStep,
    StableDiffusionInpaintSetTimestepsStep,
    StableDiffusionSetTimestepsStep,
)

__all__ = [
    "StableDiffusionAutoCheckInputsStep",
    "StableDiffusionAutoVaeEncoderStep",
    "StableDiffusionBeforeDenoiseStep",
    "StableDiffusionImg2ImgBeforeDenoiseStep",
    "StableDiffusionInpaintBeforeDenoiseStep",
    "StableDiffusionAutoBeforeDenoiseStep",
    "StableDiffusionAutoDenoiseStep",
    "StableDiffusionAutoBlocks",
]


class StableDiffusionAutoCheckInputsStep(ChosenByInputs):
    """Check the inputs of inpainting, image-to-image or text-to-image before any model runs."""

    block_classes = [
        StableDiffusionInpaintCheckInputsStep,
        StableDiffusionImg2ImgCheckInputsStep,
        StableDiffusionCheckInputsStep,
    ]
    block_names = ["inpaint_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Input checks before any model runs"


class StableDiffusionAutoVaeEncoderStep(ChosenByInputs):
    """Encode the reference image: the inpainting encoder with a mask, the img2img one with an image only."""

    block_classes = [StableDiffusionInpaintVaeEncoderStep, StableDiffusionVaeEncoderStep]
    block_names = ["inpaint_vae_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["mask_image", "image"]
    summary = "VAE encoding of the reference image"


class StableDiffusionBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: set_timesteps, then prepare_latents (initial noise)."""

    block_classes = [StableDiffusionSetTimestepsStep, StableDiffusionPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class StableDiffusionImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image preparation: set_timesteps (cut by strength), then prepare_latents (noised image)."""

    block_classes = [StableDiffusionImg2ImgSetTimestepsStep, StableDiffusionImg2ImgPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class StableDiffusionInpaintBeforeDenoiseStep(SequentialPipelineBlocks):
    """Inpainting preparation: set_timesteps (cut by strength), then prepare_latents (noise, mask latents)."""

    block_classes = [StableDiffusionInpaintSetTimestepsStep, StableDiffusionInpaintPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class StableDiffusionAutoBeforeDenoiseStep(ChosenByInputs):
    """Choose the preparation for inpainting, image-to-image or text-to-image."""

    block_classes = [
        StableDiffusionInpaintBeforeDenoiseStep,
        StableDiffusionImg2ImgBeforeDenoiseStep,
        StableDiffusionBeforeDenoiseStep,
    ]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask_image", "image", None]
    summary = "Preparation before denoising"


class StableDiffusionAutoDenoiseStep(ChosenByInputs):
    """Choose the inpainting loop (with a mask) or the plain loop."""

    block_classes = [StableDiffusionInpaintDenoiseStep, StableDiffusionDenoiseStep]
    block_names = ["inpaint_denoise", "denoise"]
    block_trigger_inputs = ["mask_image", None]
    summary = "The denoising loop"


class StableDiffusionAutoBlocks(FamilyBlocks):
    """Stable Diffusion 1.x/2.x: text-to-image, image-to-image and inpainting, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``inpainting``: needs ``mask_image``, ``image`` and ``prompt``
    """

    block_classes = [
        StableDiffusionAutoCheckInputsStep,
        IPAdapterStep,
        StableDiffusionTextEncoderStep,
        StableDiffusionInputStep,
        StableDiffusionAutoVaeEncoderStep,
        StableDiffusionAutoBeforeDenoiseStep,
        StableDiffusionAutoDenoiseStep,
        StableDiffusionDecodeStep,
    ]
    block_names = list(STAGES_WITH_IP_ADAPTER)
    _workflow_map = {"text2image": TEXT2IMAGE, "image2image": IMAGE2IMAGE, "inpainting": INPAINTING}

    description = (
        "Stable Diffusion 1.x/2.x: text-to-image with a prompt, image-to-image with an image, inpainting "
        "with an image and a mask_image."
    )
