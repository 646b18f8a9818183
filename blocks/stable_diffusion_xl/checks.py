"""The first step of every SDXL workflow: refuse bad inputs before any model runs.

Stable Diffusion's checks with SDXL's differences: two prompts per encoder pair, a negative prompt
given as one string serves every prompt, text-to-image and inpainting sizes are multiples of 8 (and
of the VAE's scale), image-to-image takes given latents as they are, and denoising_start replaces
strength.
"""

from __future__ import annotations

import math
from typing import Any

from blocks.common.checks import InputProblems, check_latents, check_one_per_prompt, check_prompt
from blocks.stable_diffusion.checks import (
    StableDiffusionCheckInputsStep,
    StableDiffusionImg2ImgCheckInputsStep,
    StableDiffusionInpaintCheckInputsStep,
)
from blocks.stable_diffusion.utils import strength_input
from modular import BlockState, InputParam

from .encoders import PROMPT_INPUTS
from .timesteps import (
    DENOISING_START,
    StableDiffusionXLImg2ImgSetTimestepsStep,
    StableDiffusionXLInpaintSetTimestepsStep,
    is_fraction,
)
from .utils import MODEL_NAME, guidance_scale, guidance_scale_input

__all__ = [
    "StableDiffusionXLCheckInputsStep",
    "StableDiffusionXLImg2ImgCheckInputsStep",
    "StableDiffusionXLInpaintCheckInputsStep",
]


class _SDXLRules:
    """SDXL's prompt inputs and rules, mixed into each of Stable Diffusion's check steps."""

    # The text encoders' embeddings reach the denoiser in their own dtype, uncast: these must agree.
    same_dtype_models: tuple[str, ...] = ("text_encoder", "text_encoder_2", "unet")

    def prompt_inputs(self) -> list[InputParam]:
        return [*PROMPT_INPUTS, guidance_scale_input()]

    def check_prompts(self, components: Any, bs: BlockState, problems: InputProblems) -> None:
        """No empty prompt list; with guidance, each negative prompt a string or one entry per prompt."""
        check_prompt(problems, "prompt", bs.prompt)
        check_prompt(problems, "prompt_2", bs.prompt_2)
        if guidance_scale(components, bs.guidance_scale) > 1 and bs.negative_prompt_embeds is None:
            for name in ("negative_prompt", "negative_prompt_2"):
                check_one_per_prompt(problems, name, getattr(bs, name), bs.prompt, one_for_all=True)

    def size_multiple(self, scale: int) -> int:
        """The classic SDXL pipelines' rule: multiples of 8 (and of the VAE's scale)."""
        return math.lcm(8, scale)

    def starts_late(self, bs: BlockState) -> bool:
        return is_fraction(getattr(bs, "denoising_start", None))


class StableDiffusionXLCheckInputsStep(_SDXLRules, StableDiffusionCheckInputsStep):
    """Text-to-image: check prompts, counts, size, latents and output type before any model runs."""

    model_name = MODEL_NAME


class StableDiffusionXLImg2ImgCheckInputsStep(_SDXLRules, StableDiffusionImg2ImgCheckInputsStep):
    """Image-to-image: also check the image, strength (or denoising_start) and given latents."""

    model_name = MODEL_NAME
    default_strength = StableDiffusionXLImg2ImgSetTimestepsStep.default_strength

    def workflow_inputs(self) -> list[InputParam]:
        return [
            InputParam.template("image"),
            strength_input(self.default_strength),
            DENOISING_START,
            InputParam.template("latents"),
        ]

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        super().check_workflow(components, bs, problems, total)
        vae = getattr(components, "vae", None)
        if total is not None and vae is not None:
            # Given latents start the denoising as they are, at their own size.
            channels = vae.config.latent_channels
            check_latents(problems, bs.latents, (total, channels, None, None))


class StableDiffusionXLInpaintCheckInputsStep(_SDXLRules, StableDiffusionInpaintCheckInputsStep):
    """Inpainting: also check image, mask, strength (or denoising_start) and the latents' shape."""

    model_name = MODEL_NAME
    default_strength = StableDiffusionXLInpaintSetTimestepsStep.default_strength

    description = (
        "Checks the inputs of inpainting before any model runs, and changes nothing: prompts, "
        "num_inference_steps and num_images_per_prompt (1 or more), output_type, height and width (positive "
        "multiples of 8 and of the VAE's scale), image and mask_image (channels, and counts that divide the "
        "batch), strength (in [0, 1], leaving at least one step), the shape of given latents, and the size "
        "of the latents (at most 64 GiB)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        *inputs, latents = super().workflow_inputs()
        return [*inputs, DENOISING_START, latents]
