"""The Wan compositions: text-to-video and image-to-video, each for one expert (Wan 2.1) or two (Wan 2.2).

A repo is one workflow (its transformer reads 16 channels for text-to-video, 36 for image-to-video), so each
workflow is its own blocks class; the classes carry the names diffusers' modular Wan gives its blocks, so a
saved index reads the same on both sides. ``Wan22Blocks`` and ``Wan22Image2VideoBlocks`` are the same steps
for the Wan 2.2 repos (two experts when the repo has ``transformer_2`` and a ``boundary_ratio``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blocks.common.workflows import FamilyBlocks
from modular import SequentialPipelineBlocks

from .before_denoise import WanImage2VideoPrepareLatentsStep, WanPrepareLatentsStep
from .checks import WanCheckInputsStep, WanImage2VideoCheckInputsStep
from .decoders import WanDecodeStep, WanImage2VideoDecodeStep
from .denoise import WanDenoiseStep, WanImage2VideoDenoiseStep
from .encoders import WanImageEncoderStep, WanTextEncoderStep
from .inputs import WanImage2VideoInputStep, WanInputStep
from .timesteps import WanSetTimestepsStep

__all__ = [
    "TEXT2VIDEO",
    "IMAGE2VIDEO",
    "Wan22Blocks",
    "Wan22Image2VideoBlocks",
    "WanBeforeDenoiseStep",
    "WanBlocks",
    "WanImage2VideoAutoBlocks",
    "WanImage2VideoBeforeDenoiseStep",
    "choose_blocks",
]

TEXT2VIDEO = {"prompt": True}
IMAGE2VIDEO = {"image": True, "prompt": True}


class WanBeforeDenoiseStep(SequentialPipelineBlocks):
    """Text-to-video preparation: set_timesteps, then prepare_latents (the initial noise)."""

    block_classes = [WanSetTimestepsStep, WanPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class WanImage2VideoBeforeDenoiseStep(SequentialPipelineBlocks):
    """Image-to-video preparation: set_timesteps, then prepare_latents (the noise and the image condition)."""

    block_classes = [WanSetTimestepsStep, WanImage2VideoPrepareLatentsStep]
    block_names = ["set_timesteps", "prepare_latents"]


class WanBlocks(FamilyBlocks):
    """Wan text-to-video: one transformer (Wan 2.1), or two experts switched at the repo's boundary (Wan 2.2).

    Supported workflows:
      - ``text2video``: needs ``prompt``
    """

    block_classes = [
        WanCheckInputsStep,
        WanTextEncoderStep,
        WanInputStep,
        WanBeforeDenoiseStep,
        WanDenoiseStep,
        WanDecodeStep,
    ]
    block_names = ["check_inputs", "text_encoder", "input", "before_denoise", "denoise", "decode"]
    _workflow_map = {"text2video": TEXT2VIDEO}

    description = (
        "Wan text-to-video: a prompt to frames; with the repo's transformer_2 and boundary_ratio (Wan 2.2) the "
        "high-noise steps run on transformer and the low-noise ones on transformer_2."
    )


class Wan22Blocks(WanBlocks):
    """Wan 2.2 text-to-video: the steps of ``WanBlocks``, two experts (transformer, transformer_2).

    Supported workflows:
      - ``text2video``: needs ``prompt``
    """


class WanImage2VideoAutoBlocks(FamilyBlocks):
    """Wan image-to-video: the first frame (and optionally the last) and a prompt to frames.

    Wan 2.1 repos condition on CLIP embeddings of the frames (image_encoder); Wan 2.2 repos have two experts
    and no image encoder.

    Supported workflows:
      - ``image2video``: needs ``image`` and ``prompt``
    """

    block_classes = [
        WanImage2VideoCheckInputsStep,
        WanTextEncoderStep,
        WanImageEncoderStep,
        WanImage2VideoInputStep,
        WanImage2VideoBeforeDenoiseStep,
        WanImage2VideoDenoiseStep,
        WanImage2VideoDecodeStep,
    ]
    block_names = [
        "check_inputs",
        "text_encoder",
        "image_encoder",
        "input",
        "before_denoise",
        "denoise",
        "decode",
    ]
    _workflow_map = {"image2video": IMAGE2VIDEO}

    description = (
        "Wan image-to-video: an image (the first frame, and last_image for the last) and a prompt to frames; "
        "Wan 2.1 adds the frames' CLIP embeddings, Wan 2.2 runs two experts switched at the boundary."
    )


class Wan22Image2VideoBlocks(WanImage2VideoAutoBlocks):
    """Wan 2.2 image-to-video: the steps of ``WanImage2VideoAutoBlocks``, two experts and no image encoder.

    Supported workflows:
      - ``image2video``: needs ``image`` and ``prompt``
    """


def choose_blocks(index: Mapping[str, Any]) -> type:
    """The blocks for a classic index: image-to-video for ``WanImageToVideoPipeline``, the Wan 2.2 names for a
    repo with a ``boundary_ratio`` (as diffusers' modular Wan chooses its pipeline class)."""
    two_experts = index.get("boundary_ratio") is not None
    if index.get("_class_name") == "WanImageToVideoPipeline":
        return Wan22Image2VideoBlocks if two_experts else WanImage2VideoAutoBlocks
    return Wan22Blocks if two_experts else WanBlocks
