"""Encoder steps: the two CLIP prompt encoders (and the refiner's one), and VAE encoding for image-to-image
and inpainting."""

from __future__ import annotations

import torch

from blocks.common.batch import check_generators, repeat_images
from blocks.common.lora_scale import lora_scale_from, lora_scaled_encoders
from blocks.common.params import BATCH_INPUTS, DTYPE, tensor_input, tensor_output
from blocks.common.prompts import as_list, check_prompt_or_embeds
from blocks.stable_diffusion.encoders import (
    StableDiffusionInpaintVaeEncoderStep,
    StableDiffusionVaeEncoderStep,
)
from blocks.stable_diffusion.utils import default_size, image_processor_for_vae, with_strength_default
from modular import ComponentSpec, ConfigSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import INPAINT_STRENGTH, MODEL_NAME, encode_image_latents, guidance_scale, guidance_scale_input

__all__ = [
    "PROMPT_2",
    "NEGATIVE_PROMPT_2",
    "PROMPT_INPUTS",
    "StableDiffusionXLTextEncoderStep",
    "StableDiffusionXLRefinerTextEncoderStep",
    "StableDiffusionXLVaeEncoderStep",
    "StableDiffusionXLInpaintVaeEncoderStep",
]

PROMPT_2 = InputParam(
    "prompt_2", type_hint=str | list[str], description="The prompt for the second encoder (default: prompt)."
)
NEGATIVE_PROMPT_2 = InputParam(
    "negative_prompt_2",
    type_hint=str | list[str],
    description="The negative prompt for the second encoder (default: negative_prompt).",
)
# The prompts and their embeddings, as the check-inputs steps declare them too.
PROMPT_INPUTS = (
    InputParam.template("prompt"),
    PROMPT_2,
    InputParam.template("negative_prompt"),
    NEGATIVE_PROMPT_2,
    InputParam.template("prompt_embeds"),
    InputParam.template("negative_prompt_embeds"),
)
_POOLED = "pooled_prompt_embeds"
_NEG_POOLED = "negative_pooled_prompt_embeds"


class StableDiffusionXLTextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt with both CLIP text encoders into SDXL's hidden states and pooled embedding."""

    model_name = MODEL_NAME
    # (tokenizer, text encoder) component names, in the order their hidden states are concatenated.
    encoder_names: tuple[tuple[str, str], ...] = (
        ("tokenizer", "text_encoder"),
        ("tokenizer_2", "text_encoder_2"),
    )

    description = (
        "Encodes prompt (first encoder) and prompt_2 (second encoder, default: prompt) into prompt_embeds, "
        "the penultimate hidden states of both encoders concatenated, and pooled_prompt_embeds, the second "
        "encoder's projected embedding. With guidance_scale > 1 the negative prompt is encoded the same way, "
        "or, when no negative prompt is given and force_zeros_for_empty_prompt is set, replaced by zeros."
    )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        specs = []
        for tokenizer, encoder in self.encoder_names:
            hint = (
                "transformers.CLIPTextModelWithProjection"
                if encoder == "text_encoder_2"
                else "transformers.CLIPTextModel"
            )
            specs += [ComponentSpec(encoder, hint), ComponentSpec(tokenizer, "transformers.CLIPTokenizer")]
        return specs

    expected_configs = [
        ConfigSpec(
            "force_zeros_for_empty_prompt",
            True,
            "Without a negative prompt, use zero embeddings as the unconditional ones.",
        )
    ]

    inputs = [
        *PROMPT_INPUTS,
        tensor_input(_POOLED, "Precomputed pooled prompt embeddings."),
        tensor_input(_NEG_POOLED, "Precomputed pooled negative embeddings."),
        guidance_scale_input(),
        InputParam("clip_skip", type_hint=int, description="Number of final CLIP layers to skip."),
        # Its "scale" is the LoRA scale, for the text encoders too (as in the classic pipeline).
        InputParam.template("cross_attention_kwargs"),
    ]

    intermediate_outputs = [
        OutputParam.template("prompt_embeds"),
        OutputParam.template("negative_prompt_embeds"),
        tensor_output(_POOLED, "Pooled text embeddings of the prompt."),
        tensor_output(_NEG_POOLED, "Pooled embeddings of the negative prompt."),
    ]

    def _encode(
        self, components, texts: list[list[str]], max_length: int | None, clip_skip: int | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states of every encoder concatenated, and the pooled embedding of the projecting one."""
        hidden_states, pooled = [], None
        for text, (tokenizer_name, encoder_name) in zip(texts, self.encoder_names, strict=True):
            tokenizer, encoder = getattr(components, tokenizer_name), getattr(components, encoder_name)
            ids = tokenizer(
                text,
                padding="max_length",
                max_length=max_length or tokenizer.model_max_length,
                truncation=True,
                return_tensors="pt",
            ).input_ids
            output = encoder(ids.to(encoder.device), output_hidden_states=True)
            if pooled is None and output[0].ndim == 2:
                pooled = output[0]
            # SDXL conditions on the penultimate layer, not normed; clip_skip goes further back.
            hidden_states.append(output.hidden_states[-(2 + (clip_skip or 0))])
        return torch.cat(hidden_states, dim=-1), pooled

    def _negative_texts(self, negative_prompt, negative_prompt_2, batch_size: int) -> list[list[str]]:
        # A single string is used for every prompt, as in the classic pipeline.
        # With one encoder (a refiner), only negative_prompt is used, as in the classic pipeline.
        negative = as_list(negative_prompt or "", batch_size)
        negative_2 = as_list(negative_prompt_2 or negative_prompt or "", batch_size)
        for name, texts in (("negative_prompt", negative), ("negative_prompt_2", negative_2)):
            if len(texts) != batch_size:
                msg = (
                    f"{type(self).__name__}: {name} needs one entry per prompt "
                    f"(got {len(texts)} negative prompts for {batch_size} prompts)"
                )
                raise ValueError(msg)
        return [negative, negative_2][: len(self.encoder_names)]

    def _check(self, bs) -> None:
        check_prompt_or_embeds(self, bs.prompt, bs.prompt_embeds)
        pairs = (("prompt_embeds", _POOLED), ("negative_prompt_embeds", _NEG_POOLED))
        for embeds, pooled in pairs:
            if getattr(bs, embeds) is not None and getattr(bs, pooled) is None:
                msg = f"{type(self).__name__}: with {embeds} pass {pooled} too (SDXL conditions on both)"
                raise ValueError(msg)

    @torch.no_grad()
    def __call__(self, components, state):
        bs = self.get_block_state(state)
        self._check(bs)
        scale = lora_scale_from(bs.cross_attention_kwargs, "cross_attention_kwargs", type(self).__name__)
        encoders = [getattr(components, encoder, None) for _, encoder in self.encoder_names]
        with lora_scaled_encoders(encoders, scale):
            self._encode_prompts(components, bs)
        self.set_block_state(state, bs)
        return components, state

    def _encode_prompts(self, components, bs) -> None:
        prompt = bs.prompt
        batch_size = len(as_list(prompt, 1)) if prompt is not None else bs.prompt_embeds.shape[0]
        prompt_embeds, pooled = bs.prompt_embeds, bs.pooled_prompt_embeds
        if prompt_embeds is None:
            texts = [as_list(prompt, 1), as_list(bs.prompt_2 or prompt, 1)][: len(self.encoder_names)]
            if len(texts[-1]) != batch_size:
                msg = (
                    f"{type(self).__name__}: prompt_2 needs one entry per prompt (got {len(texts[-1])} for "
                    f"{batch_size} prompts); pass a list of {batch_size} or leave it out to reuse prompt"
                )
                raise ValueError(msg)
            prompt_embeds, encoded_pooled = self._encode(components, texts, None, bs.clip_skip)
            pooled = encoded_pooled if pooled is None else pooled

        negative_embeds, negative_pooled = bs.negative_prompt_embeds, bs.negative_pooled_prompt_embeds
        if guidance_scale(components, bs.guidance_scale) > 1 and negative_embeds is None:
            if bs.negative_prompt is None and components.force_zeros_for_empty_prompt:
                negative_embeds, negative_pooled = torch.zeros_like(prompt_embeds), torch.zeros_like(pooled)
            else:
                texts = self._negative_texts(bs.negative_prompt, bs.negative_prompt_2, batch_size)
                # The negative prompt is never clip-skipped, as in the classic pipeline.
                negative_embeds, encoded_pooled = self._encode(
                    components, texts, prompt_embeds.shape[1], None
                )
                negative_pooled = encoded_pooled if negative_pooled is None else negative_pooled

        device, dtype = components._execution_device, components.text_encoder_2.dtype
        bs.prompt_embeds = prompt_embeds.to(dtype=dtype, device=device)
        bs.pooled_prompt_embeds = pooled
        if guidance_scale(components, bs.guidance_scale) > 1:
            bs.negative_prompt_embeds = negative_embeds.to(dtype=dtype, device=device)
            bs.negative_pooled_prompt_embeds = negative_pooled


class StableDiffusionXLRefinerTextEncoderStep(StableDiffusionXLTextEncoderStep):
    """The refiner's prompt encoding: ``text_encoder_2`` alone gives the hidden states and the pooled embedding."""

    encoder_names = (("tokenizer_2", "text_encoder_2"),)

    description = (
        "Encodes prompt with text_encoder_2 alone (prompt_2 is unused, as in the classic pipeline), since an "
        "SDXL refiner repo has no "
        "first text encoder: prompt_embeds are its penultimate hidden states, pooled_prompt_embeds its "
        "projected embedding. Negatives as in StableDiffusionXLTextEncoderStep (refiner repos set "
        "force_zeros_for_empty_prompt to false)."
    )

    expected_configs = [
        ConfigSpec(
            "force_zeros_for_empty_prompt",
            False,
            "Zero unconditional embeddings without a negative prompt.",
        )
    ]


class StableDiffusionXLVaeEncoderStep(StableDiffusionVaeEncoderStep):
    """Image-to-image: preprocess the reference image and encode it to normalized VAE latents."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` to [-1, 1] and encodes it with the VAE (in float32 when vae.config.force_upcast) "
        "into image_latents scaled by scaling_factor. A 4-channel tensor image is taken as latents already. "
        "Skipped when `latents` are given, as the classic pipeline then starts from them."
    )

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("latents"),
        *BATCH_INPUTS,
        DTYPE,
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        bs = self.get_block_state(state)
        bs.image_latents = None
        if bs.latents is None:
            image = image_processor_for_vae(components).preprocess(bs.image)
            image = image.to(device=components._execution_device, dtype=bs.dtype or components.vae.dtype)
            total = bs.batch_size * bs.num_images_per_prompt
            generator = bs.generator
            if image.shape[1] == 4:
                bs.image_latents = image
            else:
                if isinstance(generator, list):
                    check_generators(self, generator, total)
                    # One generator per output image: repeat the images to the batch, encode each with its own.
                    image = repeat_images(self, image, total)
                bs.image_latents = encode_image_latents(components.vae, image, generator)
        self.set_block_state(state, bs)
        return components, state


class StableDiffusionXLInpaintVaeEncoderStep(StableDiffusionInpaintVaeEncoderStep):
    """Inpainting: preprocess image and mask; encode the image when the UNet or the strength needs it."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` and `mask_image` to height x width, makes the masked image (the image where the "
        "mask is below 0.5), and encodes the image into image_latents (normalized as "
        "StableDiffusionXLVaeEncoderStep's) when needed: for a 4-channel UNet (pasted back each step) or a "
        "strength below 1 (noised start). The masked image is encoded later, after the noise is drawn, so "
        "the generator is used in the classic order."
    )

    inputs = with_strength_default(StableDiffusionInpaintVaeEncoderStep.inputs, INPAINT_STRENGTH)

    @torch.no_grad()
    def __call__(self, components, state):
        bs = self.get_block_state(state)
        height, width = default_size(components, bs.height, bs.width)
        image = image_processor_for_vae(components).preprocess(bs.image, height=height, width=width)
        image = image.to(dtype=torch.float32)
        mask = image_processor_for_vae(components, "mask_processor").preprocess(
            bs.mask_image, height=height, width=width
        )
        dtype = bs.dtype or components.vae.dtype
        bs.image_latents = None
        if image.shape[1] == 4:
            bs.image_latents = image.to(device=components._execution_device, dtype=dtype)
        elif components.unet.config.in_channels == 4 or (bs.latents is None and bs.strength != 1.0):
            pixels = image.to(device=components._execution_device, dtype=dtype)
            bs.image_latents = encode_image_latents(components.vae, pixels, bs.generator)
        bs.masked_image = None if image.shape[1] == 4 else image * (mask < 0.5)
        bs.mask_condition, bs.height, bs.width = mask, height, width
        self.set_block_state(state, bs)
        return components, state
