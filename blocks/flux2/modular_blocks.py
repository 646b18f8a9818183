"""The Flux.2 compositions: per-stage auto blocks and Flux2AutoBlocks."""

from __future__ import annotations

from blocks.common.workflows import IMAGE2IMAGE, TEXT2IMAGE, ChosenByInputs, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import Flux2GuidanceStep, Flux2PrepareLatentsStep
from .checks import Flux2CheckInputsStep, Flux2EditCheckInputsStep
from .decoders import Flux2DecodeStep
from .denoise import Flux2DenoiseStep
from .encoders import Flux2TextEncoderStep, Flux2VaeEncoderStep
from .inputs import Flux2InputStep
from .timesteps import Flux2SetTimestepsStep

__all__ = [
    "Flux2AutoCheckInputsStep",
    "Flux2AutoVaeEncoderStep",
    "Flux2BeforeDenoiseStep",
    "Flux2AutoBlocks",
]


class Flux2AutoCheckInputsStep(ChosenByInputs):
    """Check the inputs of editing or text-to-image before any model runs."""

    block_classes = [Flux2EditCheckInputsStep, Flux2CheckInputsStep]
    block_names = ["edit_check_inputs", "check_inputs"]
    block_trigger_inputs = ["image", None]
    summary = "Input checks before any model runs"


class Flux2AutoVaeEncoderStep(ChosenByInputs):
    """Encode the reference images when they are given."""

    block_classes = [Flux2VaeEncoderStep]
    block_names = ["edit_vae_encoder"]
    block_trigger_inputs = ["image"]
    summary = "VAE encoding of the reference images"


class Flux2BeforeDenoiseStep(SequentialPipelineBlocks):
    """Preparation: prepare_latents (packed noise), set_timesteps (empirical mu), prepare_guidance."""

    block_classes = [Flux2PrepareLatentsStep, Flux2SetTimestepsStep, Flux2GuidanceStep]
    block_names = ["prepare_latents", "set_timesteps", "prepare_guidance"]


class Flux2AutoBlocks(FamilyBlocks):
    """Flux.2: text-to-image, and editing with reference images, chosen by the inputs given.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image_conditioned``: needs ``image`` (one or a list of reference images) and ``prompt``
    """

    block_classes = [
        Flux2AutoCheckInputsStep,
        Flux2TextEncoderStep,
        Flux2InputStep,
        Flux2AutoVaeEncoderStep,
        Flux2BeforeDenoiseStep,
        Flux2DenoiseStep,
        Flux2DecodeStep,
    ]
    _workflow_map = {"text2image": TEXT2IMAGE, "image_conditioned": IMAGE2IMAGE}

    description = (
        "Flux.2: text-to-image with a prompt; editing with reference images (`image`: one or a list), "
        "each encoded and read by the transformer beside the latents."
    )
