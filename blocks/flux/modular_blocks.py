"""The Flux compositions: per-stage auto blocks and FluxAutoBlocks."""

from __future__ import annotations

from modular import AutoPipelineBlocks, SequentialPipelineBlocks

from .before_denoise import (
    FluxControlPrepareLatentsStep,
    FluxGuidanceStep,
    FluxImg2ImgGuidanceStep,
    FluxImg2ImgPrepareLatentsStep,
    FluxPrepareLatentsStep,
)
from .checks import FluxCheckInputsStep, FluxControlCheckInputsStep, FluxImg2ImgCheckInputsStep
from .decoders import FluxDecodeStep
from .denoise import FluxControlDenoiseStep, FluxDenoiseStep
from .image_encoders import FluxControlImageEncoderStep, FluxVaeEncoderStep
from .inputs import FluxInputStep
from .text_encoder import FluxTextEncoderStep
from .timesteps import FluxImg2ImgSetTimestepsStep, FluxSetTimestepsStep

__all__ = [
    "FluxAutoCheckInputsStep",
    "FluxAutoVaeEncoderStep",
    "FluxBeforeDenoiseStep",
    "FluxImg2ImgBeforeDenoiseStep",
    "FluxControlBeforeDenoiseStep",
    "FluxAutoBeforeDenoiseStep",
    "FluxAutoDenoiseStep",
    "FluxAutoBlocks",
]


class FluxAutoCheckInputsStep(AutoPipelineBlocks):
    """Check the inputs of control, image-to-image or text-to-image before any model runs."""

    block_classes = [FluxControlCheckInputsStep, FluxImg2ImgCheckInputsStep, FluxCheckInputsStep]
    block_names = ["control_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["control_image", "image", None]

    @property
    def description(self) -> str:
        return (
            "Input checks before any model runs: `control_check_inputs` when control_image is given, "
            "`img2img_check_inputs` when image is given, `check_inputs` otherwise."
        )


class FluxAutoVaeEncoderStep(AutoPipelineBlocks):
    """Encode the control image (control) or the reference image (image-to-image)."""

    block_classes = [FluxControlImageEncoderStep, FluxVaeEncoderStep]
    block_names = ["control_image_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["control_image", "image"]

    @property
    def description(self) -> str:
        return (
            "VAE encoding: `control_image_encoder` when control_image is given, `img2img_vae_encoder` when image "
            "is given, nothing for text-to-image."
        )


class FluxBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image: initial noise, timesteps shifted by its length, guidance."""

    block_classes = [FluxPrepareLatentsStep, FluxSetTimestepsStep, FluxGuidanceStep]
    block_names = ["prepare_latents", "set_timesteps", "prepare_guidance"]

    @property
    def description(self) -> str:
        return "Text-to-image preparation: prepare_latents (packed noise), set_timesteps, prepare_guidance."


class FluxImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image: timesteps cut by strength, the noised image latents, guidance."""

    block_classes = [FluxImg2ImgSetTimestepsStep, FluxImg2ImgPrepareLatentsStep, FluxImg2ImgGuidanceStep]
    block_names = ["set_timesteps", "prepare_latents", "prepare_guidance"]

    @property
    def description(self) -> str:
        return (
            "Image-to-image preparation: set_timesteps (cut by strength), prepare_latents (noised image), "
            "prepare_guidance."
        )


class FluxControlBeforeDenoiseStep(SequentialPipelineBlocks):
    """Control: initial noise for a control transformer, timesteps, guidance."""

    block_classes = [FluxControlPrepareLatentsStep, FluxSetTimestepsStep, FluxGuidanceStep]
    block_names = ["prepare_latents", "set_timesteps", "prepare_guidance"]

    @property
    def description(self) -> str:
        return "Control preparation: prepare_latents (packed noise), set_timesteps, prepare_guidance."


class FluxAutoBeforeDenoiseStep(AutoPipelineBlocks):
    """Choose the preparation for control, image-to-image or text-to-image."""

    block_classes = [FluxControlBeforeDenoiseStep, FluxImg2ImgBeforeDenoiseStep, FluxBeforeDenoiseStep]
    block_names = ["control", "img2img", "text2img"]
    block_trigger_inputs = ["control_image", "image", None]

    @property
    def description(self) -> str:
        return (
            "Preparation before denoising: `control` when control_image is given, `img2img` when image is given, "
            "`text2img` otherwise."
        )


class FluxAutoDenoiseStep(AutoPipelineBlocks):
    """Choose the control loop (with a control image) or the plain loop."""

    block_classes = [FluxControlDenoiseStep, FluxDenoiseStep]
    block_names = ["control_denoise", "denoise"]
    block_trigger_inputs = ["control_image", None]

    @property
    def description(self) -> str:
        return "The denoising loop: `control_denoise` when control_image is given, `denoise` otherwise."


class FluxAutoBlocks(SequentialPipelineBlocks):
    """Flux (FLUX.1): text-to-image, image-to-image and control, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``control``: needs ``control_image`` and ``prompt`` (a control transformer: Canny, Depth)
    """

    block_classes = [
        FluxAutoCheckInputsStep,
        FluxTextEncoderStep,
        FluxInputStep,
        FluxAutoVaeEncoderStep,
        FluxAutoBeforeDenoiseStep,
        FluxAutoDenoiseStep,
        FluxDecodeStep,
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
        "control": {"control_image": True, "prompt": True},
    }

    @property
    def description(self) -> str:
        return (
            "Flux (FLUX.1): text-to-image with a prompt, image-to-image with an image, control (canny, depth) "
            "with a control_image and a control transformer."
        )
