"""Encoder steps: CLIP prompt encoding, and VAE image encoding for image-to-image and inpainting."""

from __future__ import annotations

import logging

import torch

from blocks.common.batch import check_generators, repeat_images
from blocks.common.lora_scale import lora_scale_from, lora_scaled_encoders
from blocks.common.params import BATCH_INPUTS, DTYPE, HEIGHT_WIDTH_OUTPUTS, tensor_output
from blocks.common.prompts import check_prompt_or_embeds
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    INPAINT_STRENGTH,
    MODEL_NAME,
    default_size,
    encode_vae_image,
    guidance_scale,
    guidance_scale_input,
    image_processor_for_vae,
    strength_input,
)

__all__ = [
    "IMAGE_PROCESSOR",
    "MASK_PROCESSOR",
    "PROMPT_INPUTS",
    "StableDiffusionTextEncoderStep",
    "StableDiffusionVaeEncoderStep",
    "StableDiffusionInpaintVaeEncoderStep",
]

logger = logging.getLogger(__name__)

# Made from config before the VAE is known: the blocks resize with the loaded VAE's scale instead
# (image_processor_for_vae), as the classic pipelines do; 8 is the scale of SD's own VAE.
IMAGE_PROCESSOR = ComponentSpec(
    "image_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={"vae_scale_factor": 8},
    default_creation_method="from_config",
)
MASK_PROCESSOR = ComponentSpec(
    "mask_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={"vae_scale_factor": 8, "do_normalize": False, "do_binarize": True, "do_convert_grayscale": True},
    default_creation_method="from_config",
)


# What the prompt encoding reads, as the check-inputs step declares it too.
PROMPT_INPUTS = (
    InputParam.template("prompt"),
    InputParam.template("negative_prompt"),
    InputParam.template("prompt_embeds"),
    InputParam.template("negative_prompt_embeds"),
    guidance_scale_input(),
)


class StableDiffusionTextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt, and the negative prompt when guidance is on, with the CLIP text encoder."""

    model_name = MODEL_NAME

    description = (
        "Encodes the prompt with the CLIP text encoder into prompt_embeds, and, when guidance_scale > 1, "
        "the negative prompt (empty by default) into negative_prompt_embeds. Precomputed embeddings are used as given."
    )

    expected_components = [
        ComponentSpec("text_encoder", "transformers.CLIPTextModel"),
        ComponentSpec("tokenizer", "transformers.CLIPTokenizer"),
    ]

    inputs = [
        *PROMPT_INPUTS,
        InputParam("clip_skip", type_hint=int, description="Number of final CLIP layers to skip."),
        # Its "scale" is the LoRA scale, for the text encoder too (as in the classic pipeline).
        InputParam.template("cross_attention_kwargs"),
    ]

    intermediate_outputs = [
        OutputParam.template("prompt_embeds"),
        OutputParam.template("negative_prompt_embeds"),
    ]

    @staticmethod
    def _encode(
        components, text: str | list[str], device: torch.device, clip_skip: int | None
    ) -> torch.Tensor:
        tokenizer, text_encoder = components.tokenizer, components.text_encoder
        tokens = tokenizer(
            text,
            padding="max_length",
            max_length=tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        )
        attention_mask = None
        if getattr(text_encoder.config, "use_attention_mask", False):
            attention_mask = tokens.attention_mask.to(device)
        ids = tokens.input_ids.to(device)
        if clip_skip is None:
            return text_encoder(ids, attention_mask=attention_mask)[0]
        hidden = text_encoder(ids, attention_mask=attention_mask, output_hidden_states=True)[-1][
            -(clip_skip + 1)
        ]
        # transformers 5 flattened CLIPTextModel (no .text_model); older versions nest it.
        return getattr(text_encoder, "text_model", text_encoder).final_layer_norm(hidden)

    def _negative_text(self, prompt, negative_prompt, batch_size: int) -> list[str]:
        if negative_prompt is None:
            return [""] * batch_size
        if prompt is not None and type(prompt) is not type(negative_prompt):
            msg = (
                f"{type(self).__name__}: negative_prompt must have the type of prompt "
                f"(got {type(negative_prompt).__name__} for a {type(prompt).__name__} prompt); pass both as str or both as list"
            )
            raise TypeError(msg)
        if isinstance(negative_prompt, str):
            return [negative_prompt]
        if len(negative_prompt) != batch_size:
            msg = (
                f"{type(self).__name__}: negative_prompt needs one entry per prompt "
                f"(got {len(negative_prompt)} negative prompts for {batch_size} prompts)"
            )
            raise ValueError(msg)
        return negative_prompt

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        scale = lora_scale_from(
            block_state.cross_attention_kwargs, "cross_attention_kwargs", type(self).__name__
        )
        with lora_scaled_encoders([components.text_encoder], scale):
            self._encode_prompts(components, block_state)
        self.set_block_state(state, block_state)
        return components, state

    def _encode_prompts(self, components, block_state) -> None:
        prompt, prompt_embeds = block_state.prompt, block_state.prompt_embeds
        check_prompt_or_embeds(self, prompt, prompt_embeds)
        device = components._execution_device
        batch_size = (
            1 if isinstance(prompt, str) else len(prompt) if prompt is not None else prompt_embeds.shape[0]
        )
        if prompt_embeds is None:
            prompt_embeds = self._encode(components, prompt, device, block_state.clip_skip)
        dtype = components.text_encoder.dtype
        block_state.prompt_embeds = prompt_embeds.to(dtype=dtype, device=device)

        negative_prompt_embeds = block_state.negative_prompt_embeds
        if guidance_scale(components, block_state.guidance_scale) > 1:
            if negative_prompt_embeds is None:
                negative_text = self._negative_text(prompt, block_state.negative_prompt, batch_size)
                # The negative prompt is never clip-skipped, as in the classic pipeline.
                negative_prompt_embeds = self._encode(components, negative_text, device, None)
            negative_prompt_embeds = negative_prompt_embeds.to(dtype=dtype, device=device)
        block_state.negative_prompt_embeds = negative_prompt_embeds


class StableDiffusionVaeEncoderStep(ModularPipelineBlocks):
    """Image-to-image: preprocess the reference image and encode it to scaled VAE latents."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` (resized to a multiple of the VAE scale, normalized to [-1, 1]) and encodes it "
        "with the VAE into image_latents (a latent sample, scaled by vae.config.scaling_factor). "
        "A 4-channel tensor image is taken as latents already."
    )

    expected_components = [ComponentSpec("vae", "diffusers.AutoencoderKL"), IMAGE_PROCESSOR]

    inputs = [InputParam.template("image", required=True), *BATCH_INPUTS, DTYPE]

    intermediate_outputs = [tensor_output("image_latents", "Scaled VAE latents of the image.")]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        device = components._execution_device
        image = image_processor_for_vae(components).preprocess(block_state.image)
        dtype = block_state.dtype or components.vae.dtype
        image = image.to(device=device, dtype=dtype)
        total = block_state.batch_size * block_state.num_images_per_prompt
        generator = block_state.generator
        if image.shape[1] == 4:
            image_latents = image
        else:
            if isinstance(generator, list):
                check_generators(self, generator, total)
                # One generator per output image: encode each (repeated) reference image with its own.
                image = repeat_images(self, image, total)
            image_latents = encode_vae_image(components.vae, image, generator)
        block_state.image_latents = image_latents
        self.set_block_state(state, block_state)
        return components, state


class StableDiffusionInpaintVaeEncoderStep(ModularPipelineBlocks):
    """Inpainting: preprocess image and mask; encode the image when the UNet or the strength needs it."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` and `mask_image` to height x width, makes the masked image (the image where "
        "the mask is below 0.5), and encodes the image into image_latents when they are needed: for a "
        "4-channel UNet (blended back each step) or a strength below 1 (noised start). The masked image is "
        "encoded later, after the initial noise is drawn, so the generator is used in the classic order."
    )

    expected_components = [
        ComponentSpec("vae", "diffusers.AutoencoderKL"),
        ComponentSpec("unet", "diffusers.UNet2DConditionModel"),
        IMAGE_PROCESSOR,
        MASK_PROCESSOR,
    ]

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("mask_image", required=True),
        InputParam.template("height"),
        InputParam.template("width"),
        strength_input(INPAINT_STRENGTH),
        InputParam.template("latents"),
        InputParam.template("generator"),
        DTYPE,
    ]

    intermediate_outputs = [
        tensor_output("image_latents", "Scaled VAE latents of the image, or None."),
        tensor_output("mask_condition", "The binarized mask, [B, 1, H, W]."),
        tensor_output("masked_image", "The image with the masked area zeroed."),
        *HEIGHT_WIDTH_OUTPUTS,
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        device = components._execution_device
        height, width = default_size(components, block_state.height, block_state.width)
        init_image = image_processor_for_vae(components).preprocess(
            block_state.image, height=height, width=width
        )
        init_image = init_image.to(dtype=torch.float32)
        image_latents = None
        needs_latents = components.unet.config.in_channels == 4 or (
            block_state.latents is None and block_state.strength != 1.0
        )
        if needs_latents:
            dtype = block_state.dtype or components.vae.dtype
            image = init_image.to(device=device, dtype=dtype)
            if image.shape[1] == 4:
                image_latents = image
            else:
                image_latents = encode_vae_image(components.vae, image, block_state.generator)
        mask_condition = image_processor_for_vae(components, "mask_processor").preprocess(
            block_state.mask_image, height=height, width=width
        )
        block_state.masked_image = init_image * (mask_condition < 0.5)
        block_state.mask_condition = mask_condition
        block_state.image_latents = image_latents
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state
