"""The Z-Image compositions: per-stage auto blocks and ZImageAutoBlocks."""

from __future__ import annotations

from modular import AutoPipelineBlocks, SequentialPipelineBlocks

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


class ZImageAutoCheckInputsStep(AutoPipelineBlocks):
    """Check the inputs of image-to-image or text-to-image before any model runs."""

    block_classes = [ZImageImg2ImgCheckInputsStep, ZImageCheckInputsStep]
    block_names = ["img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["image", None]

    @property
    def description(self) -> str:
        return (
            "Input checks before any model runs: `img2img_check_inputs` when image is given, `check_inputs` "
            "otherwise."
        )


class ZImageAutoVaeEncoderStep(AutoPipelineBlocks):
    """Encode the reference image when one is given."""

    block_classes = [ZImageVaeEncoderStep]
    block_names = ["img2img_vae_encoder"]
    block_trigger_inputs = ["image"]

    @property
    def description(self) -> str:
        return "VAE encoding of the reference image: runs `img2img_vae_encoder` when image is given, else nothing."


class ZImageBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image: timesteps, then the initial noise."""

    block_classes = [ZImageSetTimestepsStep, ZImagePrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]

    @property
    def description(self) -> str:
        return "Text-to-image preparation: set_timesteps, then prepare_latents (initial noise)."


class ZImageImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image: timesteps cut by strength, then the noised image latents."""

    block_classes = [ZImageImg2ImgSetTimestepsStep, ZImageImg2ImgPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]

    @property
    def description(self) -> str:
        return "Image-to-image preparation: set_timesteps (cut by strength), then prepare_latents (noised image)."


class ZImageAutoBeforeDenoiseStep(AutoPipelineBlocks):
    """Choose the preparation for image-to-image or text-to-image."""

    block_classes = [ZImageImg2ImgBeforeDenoiseStep, ZImageBeforeDenoiseStep]
    block_names = ["img2img", "text2img"]
    block_trigger_inputs = ["image", None]

    @property
    def description(self) -> str:
        return "Preparation before denoising: `img2img` when image is given, `text2img` otherwise."


class ZImageAutoBlocks(SequentialPipelineBlocks):
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
    }

    @property
    def description(self) -> str:
        return "Z-Image: text-to-image with a prompt, image-to-image with an image (strength 0.6 by default)."
