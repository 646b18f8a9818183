"""The Flux compositions: per-stage auto blocks and FluxAutoBlocks."""

from __future__ import annotations

from blocks.common.ip_adapter import STAGES_WITH_IP_ADAPTER
from blocks.common.workflows import IMAGE2IMAGE, TEXT2IMAGE, ChosenByInputs, FamilyBlocks
from modular import SequentialPipelineBlocks

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
from .encoders import FluxControlImageEncoderStep, FluxTextEncoderStep, FluxVaeEncoderStep
from .inputs import FluxInputStep
from .ip_adapter import FluxIPAdapterStep
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


class FluxAutoCheckInputsStep(ChosenByInputs):
    """Check the inputs of control, image-to-image or text-to-image before any model runs."""

    block_classes = [FluxControlCheckInputsStep, FluxImg2ImgCheckInputsStep, FluxCheckInputsStep]
    block_names = ["control_check_inputs", "img2img_check_inputs", "check_inputs"]
    block_trigger_inputs = ["control_image", "image", None]
    summary = "Input checks before any model runs"


class FluxAutoVaeEncoderStep(ChosenByInputs):
    """Encode the control image (control) or the reference image (image-to-image)."""

    block_classes = [FluxControlImageEncoderStep, FluxVaeEncoderStep]
    block_names = ["control_image_encoder", "img2img_vae_encoder"]
    block_trigger_inputs = ["control_image", "image"]
    summary = "VAE encoding"


class FluxBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-image preparation: prepare_latents (packed noise), set_timesteps, prepare_guidance."""

    block_classes = [FluxPrepareLatentsStep, FluxSetTimestepsStep, FluxGuidanceStep]
    block_names = ["prepare_latents", "set_timesteps", "prepare_guidance"]


class FluxImg2ImgBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-image preparation: set_timesteps (cut by strength), prepare_latents (noised), guidance."""

    block_classes = [FluxImg2ImgSetTimestepsStep, FluxImg2ImgPrepareLatentsStep, FluxImg2ImgGuidanceStep]
    block_names = ["set_timesteps", "prepare_latents", "prepare_guidance"]


class FluxControlBeforeDenoiseStep(SequentialPipelineBlocks):
    """Control preparation: prepare_latents (packed noise), set_timesteps, prepare_guidance."""

    block_classes = [FluxControlPrepareLatentsStep, FluxSetTimestepsStep, FluxGuidanceStep]
    block_names = ["prepare_latents", "set_timesteps", "prepare_guidance"]


class FluxAutoBeforeDenoiseStep(ChosenByInputs):
    """Choose the preparation for control, image-to-image or text-to-image."""

    block_classes = [FluxControlBeforeDenoiseStep, FluxImg2ImgBeforeDenoiseStep, FluxBeforeDenoiseStep]
    block_names = ["control", "img2img", "text2img"]
    block_trigger_inputs = ["control_image", "image", None]
    summary = "Preparation before denoising"


class FluxAutoDenoiseStep(ChosenByInputs):
    """Choose the control loop (with a control image) or the plain loop."""

    block_classes = [FluxControlDenoiseStep, FluxDenoiseStep]
    block_names = ["control_denoise", "denoise"]
    block_trigger_inputs = ["control_image", None]
    summary = "The denoising loop"


class FluxAutoBlocks(FamilyBlocks):
    """Flux (FLUX.1): text-to-image, image-to-image and control, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image2image``: needs ``image`` and ``prompt``
      - ``control``: needs ``control_image`` and ``prompt`` (a control transformer: Canny, Depth)
    """

    block_classes = [
        FluxAutoCheckInputsStep,
        FluxIPAdapterStep,
        FluxTextEncoderStep,
        FluxInputStep,
        FluxAutoVaeEncoderStep,
        FluxAutoBeforeDenoiseStep,
        FluxAutoDenoiseStep,
        FluxDecodeStep,
    ]
    block_names = list(STAGES_WITH_IP_ADAPTER)
    _workflow_map = {
        "text2image": TEXT2IMAGE,
        "image2image": IMAGE2IMAGE,
        "control": {"control_image": True, "prompt": True},
    }

    description = (
        "Flux (FLUX.1): text-to-image with a prompt, image-to-image with an image, control (canny, depth) "
        "with a control_image and a control transformer."
    )
