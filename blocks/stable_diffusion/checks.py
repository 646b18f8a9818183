"""The first step of every Stable Diffusion workflow: refuse bad inputs before any model runs.

The rules are the classic pipelines' (``check_inputs`` and what their later steps need), checked
against the loaded UNet's and VAE's configs: text-to-image sizes are multiples of 8 (and of the VAE's
scale), inpainting sizes multiples of the VAE's scale; image-to-image takes its size from the image.
"""

from __future__ import annotations

import math
from typing import Any

from blocks.common.checks import (
    CheckInputsStep,
    ImageInfo,
    InputProblems,
    batch_total,
    check_counts,
    check_latent_memory,
    check_latents,
    check_mask,
    check_one_per_prompt,
    check_prompt,
    check_reference_image,
    check_size,
    check_strength_and_steps,
    model_dtype,
    vae_channels,
)
from modular import BlockState, InputParam

from .encoders import PROMPT_INPUTS
from .timesteps import (
    TIMESTEP_INPUTS,
    StableDiffusionImg2ImgSetTimestepsStep,
    StableDiffusionInpaintSetTimestepsStep,
    kept_steps,
)
from .utils import (
    MODEL_NAME,
    default_size,
    guidance_scale,
    strength_input,
    vae_scale_factor,
)

__all__ = [
    "StableDiffusionCheckInputsStep",
    "StableDiffusionImg2ImgCheckInputsStep",
    "StableDiffusionInpaintCheckInputsStep",
]


# The VAE's (image channels, latent channels) when none is loaded: SD's.
_VAE_CHANNELS = (3, 4)


class StableDiffusionCheckInputsStep(CheckInputsStep):
    """Text-to-image: check prompts, counts, size, latents and output type before any model runs."""

    # The text encoders' embeddings reach the denoiser in their own dtype, uncast: these must agree.
    same_dtype_models: tuple[str, ...] = ("text_encoder", "unet")

    model_name = MODEL_NAME

    description = (
        "Checks the inputs before any model runs, and changes nothing: prompts (no empty list; with "
        "guidance, one negative prompt per prompt), num_inference_steps and num_images_per_prompt (1 or "
        "more), output_type, height and width (positive multiples of 8 and of the VAE's scale), the shape "
        "of given latents, and the size of the latents to allocate (at most 64 GiB)."
    )

    # ----- inputs -----
    def prompt_inputs(self) -> list[InputParam]:
        """The prompt inputs, declared as the text encoder step declares them."""
        return list(PROMPT_INPUTS)

    def workflow_inputs(self) -> list[InputParam]:
        """The inputs of this workflow's image or size."""
        return [InputParam.template("height"), InputParam.template("width"), InputParam.template("latents")]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *self.prompt_inputs(),
            *TIMESTEP_INPUTS,
            InputParam.template("num_images_per_prompt"),
            *self.workflow_inputs(),
            InputParam.template("output_type"),
        ]

    # ----- rules -----
    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        self.check_prompts(components, block_state, problems)
        check_counts(problems, block_state)
        _, total = batch_total(block_state)
        self.check_workflow(components, block_state, problems, total)

    def check_prompts(self, components: Any, bs: BlockState, problems: InputProblems) -> None:
        """No empty prompt list; with guidance, a negative prompt of the prompt's type and count."""
        check_prompt(problems, "prompt", bs.prompt)
        if guidance_scale(components, bs.guidance_scale) > 1 and bs.negative_prompt_embeds is None:
            check_one_per_prompt(problems, "negative_prompt", bs.negative_prompt, bs.prompt, same_type=True)

    def size_multiple(self, scale: int) -> int:
        """What height and width must be multiples of: 8 (StableDiffusionPipeline's rule) and the VAE's scale."""
        return math.lcm(8, scale)

    def checked_size(
        self, components: Any, bs: BlockState, problems: InputProblems
    ) -> tuple[int, int] | None:
        """Check height and width; the size the call makes (defaults applied), or None when either is bad."""
        multiple = self.size_multiple(vae_scale_factor(components))
        before = len(problems)
        check_size(problems, "height", bs.height, multiple)
        check_size(problems, "width", bs.width, multiple)
        if len(problems) > before or getattr(components, "unet", None) is None:
            return None
        return default_size(components, bs.height, bs.width)

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        """Size, latents and memory of text-to-image."""
        size = self.checked_size(components, bs, problems)
        if size is None or total is None:
            return
        height, width = size
        scale = vae_scale_factor(components)
        channels = components.unet.config.in_channels
        # Without height and width the classic pipeline takes the given latents' own size.
        sized = bs.height is not None or bs.width is not None
        spatial = (height // scale, width // scale) if sized else (None, None)
        check_latents(problems, bs.latents, (total, channels, *spatial), (height, width) if sized else None)
        if bs.latents is None:
            shape = (total, channels, height // scale, width // scale)
            check_latent_memory(problems, shape, model_dtype(components, "unet"), (height, width))

    def check_strength_and_steps(self, bs: BlockState, problems: InputProblems, default: float) -> None:
        """strength in [0, 1], leaving at least one denoising step (custom timesteps are counted later)."""
        custom = bs.timesteps is not None or bs.sigmas is not None or self.starts_late(bs)
        check_strength_and_steps(
            problems, bs.strength, default, bs.num_inference_steps, kept_steps, custom=custom
        )

    def starts_late(self, bs: BlockState) -> bool:
        """Whether denoising starts at a given point instead of by strength (SDXL's denoising_start)."""
        return False

    def check_reference_image(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> ImageInfo:
        """The image has RGB channels (or latent ones) and a count that divides the batch."""
        rgb, latent_channels = vae_channels(components, _VAE_CHANNELS)
        return check_reference_image(problems, "image", bs.image, rgb, latent_channels, total)


class StableDiffusionImg2ImgCheckInputsStep(StableDiffusionCheckInputsStep):
    """Image-to-image: also check the image, strength and the steps it leaves."""

    default_strength = StableDiffusionImg2ImgSetTimestepsStep.default_strength

    description = (
        "Checks the inputs of image-to-image before any model runs, and changes nothing: prompts, "
        "num_inference_steps and num_images_per_prompt (1 or more), output_type, the image (RGB, or the "
        "VAE's latent channels; a count that divides the batch), strength (in [0, 1], leaving at least one "
        "step), and the size of the latents (at most 64 GiB)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [InputParam.template("image"), strength_input(self.default_strength)]

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        info = self.check_reference_image(components, bs, problems, total)
        self.check_strength_and_steps(bs, problems, self.default_strength)
        if total is None or info.height is None or info.width is None:
            return
        rgb, latent_channels = vae_channels(components, _VAE_CHANNELS)
        # The image's latents (a tensor with latent channels is taken as latents) repeated to the batch.
        scale = vae_scale_factor(components) if info.channels == rgb else 1
        shape = (total, latent_channels, info.height // scale, info.width // scale)
        size = (info.height, info.width) if scale > 1 else None
        check_latent_memory(problems, shape, model_dtype(components, "unet"), size)


class StableDiffusionInpaintCheckInputsStep(StableDiffusionCheckInputsStep):
    """Inpainting: also check image, mask, strength, and the latents' shape at the resolved size."""

    default_strength = StableDiffusionInpaintSetTimestepsStep.default_strength

    description = (
        "Checks the inputs of inpainting before any model runs, and changes nothing: prompts, "
        "num_inference_steps and num_images_per_prompt (1 or more), output_type, height and width (positive "
        "multiples of the VAE's scale), image and mask_image (channels, and counts that divide the batch), "
        "strength (in [0, 1], leaving at least one step), the shape of given latents, and the size of the "
        "latents (at most 64 GiB)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [
            InputParam.template("image"),
            InputParam.template("mask_image"),
            InputParam.template("height"),
            InputParam.template("width"),
            strength_input(self.default_strength),
            InputParam.template("latents"),
        ]

    def size_multiple(self, scale: int) -> int:
        """StableDiffusionInpaintPipeline's rule: multiples of the VAE's scale."""
        return scale

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        self.check_reference_image(components, bs, problems, total)
        if total is not None:
            check_mask(problems, bs.mask_image, total)
        self.check_strength_and_steps(bs, problems, self.default_strength)
        size = self.checked_size(components, bs, problems)
        if size is None or total is None:
            return
        height, width = size
        scale = vae_scale_factor(components)
        _, latent_channels = vae_channels(components, _VAE_CHANNELS)
        shape = (total, latent_channels, height // scale, width // scale)
        check_latents(problems, bs.latents, shape, (height, width))
        check_latent_memory(problems, shape, model_dtype(components, "unet"), (height, width))
