"""The first step of every Z-Image workflow: refuse bad inputs before any model runs.

As the classic Z-Image pipelines: height and width are positive multiples of twice the VAE's scale
(the transformer patches 2x2 latent cells); image-to-image takes them from the image unless told,
and a given size must then be the image's.
"""

from __future__ import annotations

from typing import Any

from blocks.common.checks import (
    CheckInputsStep,
    InputProblems,
    batch_total,
    check_counts,
    check_latent_memory,
    check_latents,
    check_one_per_prompt,
    check_prompt,
    check_reference_image,
    check_size,
    check_strength_and_steps,
    model_dtype,
)
from blocks.common.timesteps import flow_kept_steps
from blocks.common.vae import patched_latent_size, vae_scale_factor
from modular import BlockState, InputParam

from .encoders import PROMPT_INPUTS
from .timesteps import SIGMAS, STRENGTH, STRENGTH_INPUT
from .utils import DEFAULT_SIZE, MODEL_NAME, do_classifier_free_guidance, guidance_scale

__all__ = ["ZImageCheckInputsStep", "ZImageImg2ImgCheckInputsStep"]


class ZImageCheckInputsStep(CheckInputsStep):
    """Text-to-image: check prompts, counts, size, latents and output type before any model runs."""

    # The text encoders' embeddings reach the denoiser in their own dtype, uncast: these must agree.
    same_dtype_models: tuple[str, ...] = ("text_encoder", "transformer")

    model_name = MODEL_NAME

    description = (
        "Checks the inputs before any model runs, and changes nothing: prompts (no empty list; with guidance, "
        "one negative prompt per prompt), num_inference_steps and num_images_per_prompt (1 or more), "
        "output_type, height and width (positive multiples of twice the VAE's scale), the shape of given "
        "latents, and the size of the latents (at most 64 GiB)."
    )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *PROMPT_INPUTS,
            InputParam.template("num_inference_steps"),
            SIGMAS,
            InputParam.template("num_images_per_prompt"),
            InputParam.template("height"),
            InputParam.template("width"),
            InputParam.template("latents"),
            *self.workflow_inputs(),
            InputParam.template("output_type"),
        ]

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        bs = block_state
        check_prompt(problems, "prompt", bs.prompt)
        if (
            do_classifier_free_guidance(guidance_scale(components, bs.guidance_scale))
            and bs.negative_prompt_embeds is None
        ):
            check_one_per_prompt(problems, "negative_prompt", bs.negative_prompt, bs.prompt)
        check_counts(problems, bs)
        multiple = vae_scale_factor(components) * 2
        before = len(problems)
        check_size(problems, "height", bs.height, multiple)
        check_size(problems, "width", bs.width, multiple)
        sized = len(problems) == before
        _, total = batch_total(bs)
        self.check_workflow(components, bs, problems, total, sized)

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None, sized: bool
    ) -> None:
        """The latents' shape and memory at the size asked for (1024 x 1024 by default)."""
        transformer = getattr(components, "transformer", None)
        if not sized or total is None or transformer is None:
            return
        height = DEFAULT_SIZE if bs.height is None else bs.height
        width = DEFAULT_SIZE if bs.width is None else bs.width
        shape = (total, transformer.config.in_channels, *patched_latent_size(components, height, width))
        check_latents(problems, bs.latents, shape, (height, width))
        if bs.latents is None:
            check_latent_memory(problems, shape, model_dtype(components, "transformer"), (height, width))


class ZImageImg2ImgCheckInputsStep(ZImageCheckInputsStep):
    """Image-to-image: also check the image, its size against a given one, strength and the steps left."""

    description = (
        "Checks the inputs of image-to-image before any model runs, and changes nothing: prompts, counts and "
        "output_type as text-to-image, the image (RGB, or the transformer's latent channels; a count that "
        "divides the batch; its size, rounded down to a multiple of twice the VAE's scale, is the one a given "
        "height and width must have), strength (in [0, 1], leaving at least one step), given latents' batch "
        "and channels, and the size of the latents (at most 64 GiB)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [InputParam.template("image"), STRENGTH_INPUT]

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None, sized: bool
    ) -> None:
        vae = getattr(components, "vae", None)
        transformer = getattr(components, "transformer", None)
        rgb = vae.config.in_channels if vae is not None else 3
        latent_channels = transformer.config.in_channels if transformer is not None else 16
        info = check_reference_image(problems, "image", bs.image, rgb, latent_channels, total)
        check_strength_and_steps(
            problems,
            bs.strength,
            STRENGTH,
            bs.num_inference_steps,
            flow_kept_steps,
            custom=bs.sigmas is not None,
        )
        if info.channels != rgb or info.height is None or info.width is None:
            return
        multiple = vae_scale_factor(components) * 2
        image_size = {
            "height": info.height // multiple * multiple,
            "width": info.width // multiple * multiple,
        }
        if sized and bs.latents is None:
            for name, own in image_size.items():
                given = getattr(bs, name)
                if given is not None and given != own:
                    problems.add(
                        f"{name} ({given}) must be the image's {name} ({own}, a multiple of {multiple}): the image "
                        "is not resized; leave height and width unset to use the image's size, or resize the image"
                    )
        if total is not None and transformer is not None:
            check_latents(problems, bs.latents, (total, latent_channels, None, None))
            # The image's latents, repeated to the batch, and the noise beside them.
            size = (image_size["height"], image_size["width"])
            shape = (total, latent_channels, *patched_latent_size(components, *size))
            check_latent_memory(problems, shape, model_dtype(components, "transformer"), size)
