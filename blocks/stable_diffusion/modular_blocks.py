"""The Stable Diffusion compositions: per-stage auto blocks and StableDiffusionAutoBlocks."""

from __future__ import annotations

from modular import AutoPipelineBlocks, SequentialPipelineBlocks

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


class StableDiffusionAutoCheckInputsStep(AutoPipelineBlocks):
    """Check the inputs of inpainting, image-to-image or text-to-image before any model runs."""

    block_classes = [
        StableDiffusionInpaintCheckInputsStep,
        StableDiffusionImg2ImgCheckInputsStep,
        StableDiffusionCheckInputsStep,
    ]
    block_names = ["inpaint_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["mask_image", "image", None]

    @property
    def description(self) -> str:
        return (
            "Input checks before any model runs: `inpaint_check_inputs` when mask_image is given, "
            "`img2img_check_inputs` when image is given, `check_inputs` otherwise."
        )


class StableDiffusionAutoVaeEncoderStep(AutoPipelineBlocks):
    """Encode the reference image: the inpainting encoder with a mask, the img2img one with an image only."""

    block_classes = [StableDiffusionInpaintVaeEncoderStep, StableDiffusionVaeEncoderStep]
    block_names = ["inpaint_vae_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["mask_image", "image"]

    @property
    def description(self) -> str:
        return (
            "VAE encoding of the reference image. Runs `inpaint_vae_encoder` when mask_image is given, "
            "`img2img_vae_encoder` when "
            "image is given, and nothing for text-to-image."
        )


class StableDiffusionBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image: timesteps, then the initial noise."""

    block_classes = [StableDiffusionSetTimestepsStep, StableDiffusionPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]

    @property
    def description(self) -> str:
        return "Text-to-image preparation: set_timesteps, then prepare_latents (initial noise)."


class StableDiffusionImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image: timesteps cut by strength, then the noised image latents."""

    block_classes = [StableDiffusionImg2ImgSetTimestepsStep, StableDiffusionImg2ImgPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]

    @property
    def description(self) -> str:
        return "Image-to-image preparation: set_timesteps (cut by strength), then prepare_latents (noised image)."


class StableDiffusionInpaintBeforeDenoiseStep(SequentialPipelineBlocks):
    """Inpainting: timesteps cut by strength, then the initial latents and the mask latents."""

    block_classes = [StableDiffusionInpaintSetTimestepsStep, StableDiffusionInpaintPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]

    @property
    def description(self) -> str:
        return "Inpainting preparation: set_timesteps (cut by strength), then prepare_latents (noise and mask latents)."


class StableDiffusionAutoBeforeDenoiseStep(AutoPipelineBlocks):
    """Choose the preparation for inpainting, image-to-image or text-to-image."""

    block_classes = [
        StableDiffusionInpaintBeforeDenoiseStep,
        StableDiffusionImg2ImgBeforeDenoiseStep,
        StableDiffusionBeforeDenoiseStep,
    ]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask_image", "image", None]

    @property
    def description(self) -> str:
        return (
            "Preparation before denoising: `inpaint` when mask_image is given, `img2img` when image is given, "
            "`text2img` otherwise."
        )


class StableDiffusionAutoDenoiseStep(AutoPipelineBlocks):
    """Choose the inpainting loop (with a mask) or the plain loop."""

    block_classes = [StableDiffusionInpaintDenoiseStep, StableDiffusionDenoiseStep]
    block_names = ["inpaint_denoise", "denoise"]
    block_trigger_inputs = ["mask_image", None]

    @property
    def description(self) -> str:
        return "The denoising loop: `inpaint_denoise` when mask_image is given, `denoise` otherwise."


class StableDiffusionAutoBlocks(SequentialPipelineBlocks):
    """Stable Diffusion 1.x/2.x: text-to-image, image-to-image and inpainting, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``inpainting``: needs ``mask_image``, ``image`` and ``prompt``
    """

    block_classes = [
        StableDiffusionAutoCheckInputsStep,
        StableDiffusionTextEncoderStep,
        StableDiffusionInputStep,
        StableDiffusionAutoVaeEncoderStep,
        StableDiffusionAutoBeforeDenoiseStep,
        StableDiffusionAutoDenoiseStep,
        StableDiffusionDecodeStep,
    ]
    block_names = [
        "check_inputs",
        "text_encoder",
        "input",
        "vae_encoder",
        "before_denoise",
        "denoise",
        "decode",
    ]
    _workflow_map = {
        "text2image": {"prompt": True},
        "image2image": {"image": True, "prompt": True},
        "inpainting": {"mask_image": True, "image": True, "prompt": True},
    }

    @property
    def description(self) -> str:
        return (
            "Stable Diffusion 1.x/2.x: text-to-image with a prompt, image-to-image with an image, inpainting "
            "with an image and a mask_image."
        )
