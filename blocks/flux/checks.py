"""The first step of every Flux workflow: refuse bad inputs before any model runs.

As the classic Flux pipelines, a height or width that is not a multiple of twice the VAE's scale is
accepted and rounded down (with a warning); one below that multiple, zero or negative is refused.
Given latents are packed, [batch, tokens, channels * 4], and must fit the size.
"""

from __future__ import annotations

from typing import Any

import attrs

from blocks.common.checks import (
    CheckInputsStep,
    InputProblems,
    batch_total,
    check_counts,
    check_image,
    check_latent_memory,
    check_latents,
    check_one_per_prompt,
    check_prompt,
    check_reference_image,
    check_size,
    check_strength_and_steps,
    image_info,
    model_dtype,
    vae_channels,
)
from blocks.common.timesteps import flow_kept_steps
from blocks.common.vae import patched_latent_size, vae_scale_factor
from modular import BlockState, InputParam

from .encoders import CONTROL_IMAGE, NEGATIVE_PROMPT, PROMPT_2, PROMPT_EMBEDS, TRUE_CFG_SCALE
from .timesteps import STRENGTH, TIMESTEP_INPUTS, FluxImg2ImgSetTimestepsStep
from .utils import LATENTS, MODEL_NAME, default_size, transformer_channels_problem

__all__ = ["FluxCheckInputsStep", "FluxImg2ImgCheckInputsStep", "FluxControlCheckInputsStep"]


class FluxCheckInputsStep(CheckInputsStep):
    """Text-to-image: check prompts, counts, size, packed latents and the transformer before any model runs."""

    # The text encoders' embeddings reach the denoiser in their own dtype, uncast: these must agree.
    same_dtype_models: tuple[str, ...] = ("text_encoder", "text_encoder_2", "transformer")

    model_name = MODEL_NAME
    # Latents the transformer reads per token: 1, or 2 for a control transformer (latents + control).
    inputs_per_latent = 1

    description = (
        "Checks the inputs before any model runs, and changes nothing: prompts (no empty list; prompt_2 and, "
        "with true CFG, the negative prompt one entry per prompt), num_inference_steps and "
        "num_images_per_prompt (1 or more), output_type, height and width (at least twice the VAE's scale; "
        "other sizes are rounded down to a multiple of it), that the transformer suits the workflow, the "
        "shape of given packed latents, and the size of the latents (at most 64 GiB)."
    )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("prompt"),
            PROMPT_2,
            NEGATIVE_PROMPT,
            PROMPT_EMBEDS,
            InputParam.template("negative_prompt_embeds"),
            TRUE_CFG_SCALE,
            *TIMESTEP_INPUTS,
            InputParam.template("num_images_per_prompt"),
            InputParam.template("height"),
            InputParam.template("width"),
            LATENTS,
            *self.workflow_inputs(),
            InputParam.template("output_type"),
        ]

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        bs = block_state
        count, total = batch_total(bs)
        check_prompt(problems, "prompt", bs.prompt)
        check_prompt(problems, "prompt_2", bs.prompt_2)
        if bs.prompt is not None and bs.prompt_2 is not None:
            check_one_per_prompt(problems, "prompt_2", bs.prompt_2, bs.prompt)
        if bs.true_cfg_scale > 1 and bs.negative_prompt_embeds is None:
            check_one_per_prompt(problems, "negative_prompt", bs.negative_prompt, bs.prompt, same_type=True)
        check_counts(problems, bs)
        transformer = getattr(components, "transformer", None)
        if transformer is not None:
            problem = transformer_channels_problem(transformer.config, self.inputs_per_latent)
            if problem:
                problems.add(problem)
        self.check_workflow(components, bs, problems, count, total)
        self.check_size_and_latents(components, bs, problems, total)

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, count: int | None, total: int | None
    ) -> None:
        """The reference or control image of this workflow (none for text-to-image)."""

    def check_size_and_latents(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        """height and width, the packed latents' shape at that size, and the latents' memory."""
        multiple = vae_scale_factor(components) * 2
        before = len(problems)
        check_size(problems, "height", bs.height, multiple, floor=True)
        check_size(problems, "width", bs.width, multiple, floor=True)
        transformer = getattr(components, "transformer", None)
        if len(problems) > before or total is None or transformer is None:
            return
        height, width = default_size(components, bs.height, bs.width)
        latent_height, latent_width = patched_latent_size(components, height, width)
        channels = (transformer.config.out_channels or transformer.config.in_channels) // 4
        tokens = (latent_height // 2) * (latent_width // 2)
        check_latents(problems, bs.latents, (total, tokens, channels * 4), (height, width))
        if bs.latents is None:
            shape = (total, channels, latent_height, latent_width)
            check_latent_memory(problems, shape, model_dtype(components, "transformer"), (height, width))


class FluxImg2ImgCheckInputsStep(FluxCheckInputsStep):
    """Image-to-image: also check the image, strength and the steps it leaves."""

    default_strength = FluxImg2ImgSetTimestepsStep.default_strength

    description = (
        "Checks the inputs of image-to-image before any model runs, as text-to-image does, and the image "
        "(RGB, or the VAE's latent channels; a count that divides the batch) and strength (in [0, 1], "
        "leaving at least one step)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [InputParam.template("image"), STRENGTH]

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, count: int | None, total: int | None
    ) -> None:
        rgb, latent_channels = vae_channels(components, (3, 16))
        check_reference_image(problems, "image", bs.image, rgb, latent_channels, total)
        check_strength_and_steps(
            problems,
            bs.strength,
            self.default_strength,
            bs.num_inference_steps,
            flow_kept_steps,
            custom=bs.sigmas is not None,
        )


class FluxControlCheckInputsStep(FluxCheckInputsStep):
    """Control: also check the control image and that the transformer is a control one."""

    inputs_per_latent = 2

    description = (
        "Checks the inputs of control before any model runs, as text-to-image does, for a control "
        "transformer, and the control image (RGB; one, or one per prompt)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [attrs.evolve(CONTROL_IMAGE, required=False)]

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, count: int | None, total: int | None
    ) -> None:
        image = bs.control_image
        info = image_info(image)
        # A 3-dim tensor is taken as packed control latents already; other images are encoded from RGB.
        packed = hasattr(image, "ndim") and image.ndim == 3
        if not packed:
            vae = getattr(components, "vae", None)
            check_image(
                problems, "control_image", info, vae.config.in_channels if vae is not None else 3, None
            )
        images = image.shape[0] if packed else info.images
        if count is not None and images not in (0, 1, count):
            problems.add(
                f"control_image holds {images} images for {count} prompts; "
                "pass 1 control image or one per prompt"
            )
