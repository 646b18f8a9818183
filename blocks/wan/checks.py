"""The first step of every Wan workflow: refuse bad inputs before any model runs.

As the classic Wan pipelines: height and width are multiples of 16, prompts are strings or lists of them,
``guidance_scale_2`` only for a repo with a ``boundary_ratio`` (Wan 2.2); image-to-video needs an image,
and ``image_embeds`` only for a repo without one (Wan 2.1).
"""

from __future__ import annotations

from typing import Any

import PIL.Image
import torch

from blocks.common.checks import (
    CheckInputsStep,
    InputProblems,
    check_at_least_one,
    check_output_type,
    check_prompt,
    check_size,
    prompt_count,
)
from modular import BlockState, InputParam

from .before_denoise import SIZE_INPUTS
from .decoders import OUTPUT_TYPE
from .denoise import GUIDANCE_SCALE_2
from .encoders import FIRST_FRAME, LAST_FRAME, PROMPT_INPUTS
from .inputs import IMAGE_EMBEDS, NUM_VIDEOS_PER_PROMPT
from .utils import BOUNDARY_RATIO, MODEL_NAME, do_classifier_free_guidance, guidance_scale

__all__ = ["WanCheckInputsStep", "WanImage2VideoCheckInputsStep"]

_SIZE_MULTIPLE = 16  # the classic pipelines' rule for height and width


class WanCheckInputsStep(CheckInputsStep):
    """Text-to-video: check prompts, counts, size, guidance_scale_2 and output type before any model runs."""

    model_name = MODEL_NAME

    description = (
        "Checks the inputs before any model runs, and changes nothing: prompts (strings or non-empty lists; "
        "with guidance, one negative prompt per prompt), num_inference_steps, num_videos_per_prompt and "
        "num_frames (1 or more), height and width (positive multiples of 16), output_type, and "
        "guidance_scale_2 only for a repo with a boundary_ratio (Wan 2.2's two experts)."
    )

    expected_configs = [BOUNDARY_RATIO]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *PROMPT_INPUTS,
            GUIDANCE_SCALE_2,
            InputParam.template("num_inference_steps"),
            NUM_VIDEOS_PER_PROMPT,
            *SIZE_INPUTS,
            InputParam.template("latents"),
            *self.workflow_inputs(),
            OUTPUT_TYPE,
        ]

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        bs = block_state
        for name in ("prompt", "negative_prompt"):
            value = getattr(bs, name)
            if value is not None and not (isinstance(value, str) or _strings(value)):
                problems.add(
                    f"{name} must be a string or a list of strings (got a {type(value).__name__})",
                    wrong_type=True,
                )
            check_prompt(problems, name, value)
        if bs.prompt is not None and bs.prompt_embeds is not None:
            problems.add("pass prompt or prompt_embeds, not both")
        if bs.prompt is None and bs.prompt_embeds is None:
            problems.add("pass prompt (or prompt_embeds)")
        if bs.negative_prompt is not None and bs.negative_prompt_embeds is not None:
            problems.add("pass negative_prompt or negative_prompt_embeds, not both")
        guided = do_classifier_free_guidance(guidance_scale(components, bs.guidance_scale))
        count = prompt_count(bs.prompt, bs.prompt_embeds)
        if (
            guided
            and isinstance(bs.negative_prompt, list)
            and count is not None
            and len(bs.negative_prompt) != count
        ):
            problems.add(
                f"negative_prompt has {len(bs.negative_prompt)} entries for {count} prompts; pass one per prompt, "
                "or a single string"
            )
        check_at_least_one(problems, "num_inference_steps", bs.num_inference_steps, "denoising steps")
        check_at_least_one(problems, "num_videos_per_prompt", bs.num_videos_per_prompt, "videos per prompt")
        check_at_least_one(problems, "num_frames", bs.num_frames, "frames")
        check_size(problems, "height", bs.height, _SIZE_MULTIPLE)
        check_size(problems, "width", bs.width, _SIZE_MULTIPLE)
        check_output_type(problems, bs.output_type)
        if bs.guidance_scale_2 is not None and getattr(components, "boundary_ratio", None) is None:
            problems.add(
                "guidance_scale_2 is the low-noise expert's scale, and this repo has one expert (no boundary_ratio); "
                "leave guidance_scale_2 unset"
            )
        self.check_workflow(components, bs, problems)

    def check_workflow(self, components: Any, bs: BlockState, problems: InputProblems) -> None:
        """What the workflow adds; nothing for text-to-video."""


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


class WanImage2VideoCheckInputsStep(WanCheckInputsStep):
    """Image-to-video: also check the first (and last) frame and the image embeddings."""

    description = (
        "Checks the inputs of image-to-video before any model runs, and changes nothing: as text-to-video, and "
        "`image` (and `last_image`) a PIL image or a tensor, and image_embeds only for a repo without a "
        "boundary_ratio (Wan 2.1, whose transformer reads them)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [FIRST_FRAME, LAST_FRAME, IMAGE_EMBEDS]

    def check_workflow(self, components: Any, bs: BlockState, problems: InputProblems) -> None:
        for name in ("image", "last_image"):
            value = getattr(bs, name)
            if value is not None and not isinstance(value, torch.Tensor | PIL.Image.Image):
                problems.add(
                    f"{name} must be a PIL image or a tensor (got a {type(value).__name__})", wrong_type=True
                )
        if bs.image is None:
            problems.add("image-to-video needs image (the first frame); pass image=...")
        if bs.image_embeds is not None and getattr(components, "boundary_ratio", None) is not None:
            problems.add(
                "image_embeds are for Wan 2.1 image-to-video; this repo has a boundary_ratio (Wan 2.2), whose "
                "transformers read no image embeddings; leave image_embeds unset"
            )
