"""The first step of every SD3 workflow: refuse bad inputs before any model runs.

As the classic SD3 pipelines: height and width are multiples of the VAE scale x the transformer's patch size;
image-to-image and inpainting resize the image to them (default: the transformer's sample size in pixels).
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
    check_mask,
    check_one_per_prompt,
    check_prompt,
    check_reference_image,
    check_size,
    check_strength_and_steps,
    model_dtype,
    vae_channels,
)
from blocks.common.timesteps import flow_kept_steps
from blocks.common.vae import vae_scale_factor
from modular import BlockState, InputParam

from .denoise import SKIP_LAYER_INPUTS
from .encoders import MAX_SEQUENCE_LENGTH, PROMPT_INPUTS
from .image_encoders import MASKED_IMAGE_LATENTS, PADDING_MASK_CROP
from .timesteps import IMAGE2IMAGE_STEPS, SIGMAS, STRENGTH, STRENGTH_INPUT, TEXT2IMAGE_STEPS, steps_input
from .utils import MODEL_NAME, default_size, do_classifier_free_guidance, guidance_scale, size_multiple

__all__ = ["SD3CheckInputsStep", "SD3Img2ImgCheckInputsStep", "SD3InpaintCheckInputsStep"]


class SD3CheckInputsStep(CheckInputsStep):
    """Text-to-image: check prompts, counts, size, latents and skip-layer guidance before any model runs."""

    # The text encoders' embeddings reach the transformer in their own dtype, uncast: these must agree.
    same_dtype_models: tuple[str, ...] = ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer")

    model_name = MODEL_NAME
    steps_default = TEXT2IMAGE_STEPS

    description = (
        "Checks the inputs before any model runs, and changes nothing: prompts (no empty list; prompt_2 and "
        "prompt_3 one entry per prompt, and with guidance the negative prompts), max_sequence_length (at most "
        "512), num_inference_steps and num_images_per_prompt (1 or more), output_type, height and width "
        "(positive multiples of the VAE scale x the patch size), skip_guidance_layers (layers the transformer "
        "has), the shape of given latents, and the size of the latents (at most 64 GiB)."
    )

    @property
    def inputs(self) -> list[InputParam]:
        return [
            *PROMPT_INPUTS,
            steps_input(self.steps_default),
            SIGMAS,
            InputParam.template("num_images_per_prompt"),
            InputParam.template("height"),
            InputParam.template("width"),
            InputParam.template("latents"),
            SKIP_LAYER_INPUTS[0],
            *self.workflow_inputs(),
            InputParam.template("output_type"),
        ]

    def check(self, components: Any, block_state: BlockState, problems: InputProblems) -> None:
        bs = block_state
        count, total = batch_total(bs)
        for name in ("prompt", "prompt_2", "prompt_3"):
            check_prompt(problems, name, getattr(bs, name))
        for name in ("prompt_2", "prompt_3"):
            if bs.prompt is not None and getattr(bs, name):
                check_one_per_prompt(problems, name, getattr(bs, name), bs.prompt)
        if (
            do_classifier_free_guidance(guidance_scale(components, bs.guidance_scale))
            and bs.negative_prompt_embeds is None
        ):
            for name in ("negative_prompt", "negative_prompt_2", "negative_prompt_3"):
                check_one_per_prompt(problems, name, getattr(bs, name), bs.prompt, one_for_all=True)
        if bs.max_sequence_length is not None and bs.max_sequence_length > MAX_SEQUENCE_LENGTH:
            problems.add(
                f"max_sequence_length ({bs.max_sequence_length}) must be at most {MAX_SEQUENCE_LENGTH} (T5's limit); "
                f"pass {MAX_SEQUENCE_LENGTH} or less"
            )
        check_counts(problems, bs)
        self.check_skip_layers(components, bs, problems)
        multiple = size_multiple(components)
        before = len(problems)
        check_size(problems, "height", bs.height, multiple)
        check_size(problems, "width", bs.width, multiple)
        sized = len(problems) == before
        self.check_workflow(components, bs, problems, total)
        if sized and total is not None:
            self.check_latents(components, bs, problems, total)

    def check_skip_layers(self, components: Any, bs: BlockState, problems: InputProblems) -> None:
        layers = bs.skip_guidance_layers
        transformer = getattr(components, "transformer", None)
        if layers is None or transformer is None:
            return
        count = len(transformer.transformer_blocks)
        wrong = [layer for layer in layers if not isinstance(layer, int) or not 0 <= layer < count]
        if wrong:
            problems.add(
                f"skip_guidance_layers ({list(layers)}) names layers {wrong} the transformer does not have; pass "
                f"indices in [0, {count - 1}]"
            )

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        """The image (and mask) of this workflow; none for text-to-image."""

    def latent_channels(self, components: Any) -> int:
        return components.transformer.config.in_channels

    def check_latents(self, components: Any, bs: BlockState, problems: InputProblems, total: int) -> None:
        """Given latents' shape at the size asked for, and the latents' memory."""
        if getattr(components, "transformer", None) is None:
            return
        height, width = default_size(components, bs.height, bs.width)
        scale = vae_scale_factor(components)
        shape = (total, self.latent_channels(components), height // scale, width // scale)
        check_latents(problems, bs.latents, shape, (height, width))
        if bs.latents is None:
            check_latent_memory(problems, shape, model_dtype(components, "transformer"), (height, width))


class SD3Img2ImgCheckInputsStep(SD3CheckInputsStep):
    """Image-to-image: also check the image, strength and the steps it leaves."""

    steps_default = IMAGE2IMAGE_STEPS

    description = (
        "Checks the inputs of image-to-image before any model runs, as text-to-image does, and the image "
        "(RGB, or the VAE's latent channels; a count that divides the batch) and strength (in [0, 1], "
        "leaving at least one step)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [InputParam.template("image"), STRENGTH_INPUT]

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        rgb, latent_channels = vae_channels(components, (3, 16))
        check_reference_image(problems, "image", bs.image, rgb, latent_channels, total)
        check_strength_and_steps(
            problems,
            bs.strength,
            STRENGTH,
            bs.num_inference_steps,
            flow_kept_steps,
            custom=bs.sigmas is not None,
        )


class SD3InpaintCheckInputsStep(SD3Img2ImgCheckInputsStep):
    """Inpainting: also check the mask and the transformer's input channels."""

    description = (
        "Checks the inputs of inpainting before any model runs, as image-to-image does, the mask (single-channel; "
        "a count that divides the batch) and that the transformer reads the latents alone or with the mask "
        "channels (latents + 1 + latents)."
    )

    def workflow_inputs(self) -> list[InputParam]:
        return [
            *super().workflow_inputs(),
            InputParam.template("mask_image"),
            MASKED_IMAGE_LATENTS,
            PADDING_MASK_CROP,
        ]

    def latent_channels(self, components: Any) -> int:
        vae = getattr(components, "vae", None)
        return vae.config.latent_channels if vae is not None else 16

    def check_workflow(
        self, components: Any, bs: BlockState, problems: InputProblems, total: int | None
    ) -> None:
        super().check_workflow(components, bs, problems, total)
        if bs.mask_image is not None and total is not None:
            check_mask(problems, bs.mask_image, total)
        transformer, vae = getattr(components, "transformer", None), getattr(components, "vae", None)
        if transformer is not None and vae is not None:
            channels, latent = transformer.config.in_channels, vae.config.latent_channels
            if channels not in (latent, 2 * latent + 1):
                problems.add(
                    f"the transformer takes {channels} input channels; inpainting needs {latent} (the latents) or "
                    f"{2 * latent + 1} (latents, mask and masked image: an inpainting transformer)"
                )
        if bs.padding_mask_crop is not None and bs.output_type not in (None, "pil"):
            problems.add(
                f"padding_mask_crop pastes the result into the original image, which only 'pil' output does "
                f"(got output_type {bs.output_type!r}); pass output_type='pil', or no padding_mask_crop"
            )
