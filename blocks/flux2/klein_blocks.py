"""The Flux.2 Klein composition: Flux.2's steps with Klein's prompt encoding, denoiser and decoding."""

from __future__ import annotations

from blocks.common.workflows import IMAGE2IMAGE, TEXT2IMAGE, FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import Flux2PrepareLatentsStep
from .decoders import Flux2KleinDecodeStep
from .klein_denoise import Flux2KleinDenoiseStep
from .klein_encoders import Flux2KleinInputStep, Flux2KleinTextEncoderStep
from .modular_blocks import Flux2AutoCheckInputsStep, Flux2AutoVaeEncoderStep
from .timesteps import Flux2SetTimestepsStep

__all__ = ["Flux2KleinBeforeDenoiseStep", "Flux2KleinBaseAutoBlocks"]


class Flux2KleinBeforeDenoiseStep(SequentialPipelineBlocks):
    """Preparation: prepare_latents (packed noise), set_timesteps (empirical mu); no embedded guidance."""

    block_classes = [Flux2PrepareLatentsStep, Flux2SetTimestepsStep]
    block_names = ["prepare_latents", "set_timesteps"]


class Flux2KleinBaseAutoBlocks(FamilyBlocks):
    """Flux.2 Klein: text-to-image, and generation with reference images, chosen by the inputs given; base
    (classifier-free guidance through the guider) and step-distilled repos (``is_distilled``: no guidance) alike.

    Supported workflows:
      - ``text2image``: needs ``prompt``
      - ``image_conditioned``: needs ``image`` (one or a list of reference images) and ``prompt``
    """

    block_classes = [
        Flux2AutoCheckInputsStep,
        Flux2KleinTextEncoderStep,
        Flux2KleinInputStep,
        Flux2AutoVaeEncoderStep,
        Flux2KleinBeforeDenoiseStep,
        Flux2KleinDenoiseStep,
        Flux2KleinDecodeStep,
    ]
    _workflow_map = {"text2image": TEXT2IMAGE, "image_conditioned": IMAGE2IMAGE}

    description = (
        "Flux.2 Klein (a Qwen3 text encoder, true classifier-free guidance unless distilled): text-to-image "
        "with a prompt; reference images (`image`: one or a list) read beside the latents."
    )
