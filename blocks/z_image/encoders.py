"""Encoder steps: Qwen3 prompt encoding through the chat template, and VAE image encoding for image-to-image."""

from __future__ import annotations

import torch

from blocks.common.params import DTYPE, HEIGHT_WIDTH_OUTPUTS, tensor_output
from blocks.common.prompts import as_list, check_prompt_or_embeds
from blocks.common.vae import encode_shifted_latents
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    IMAGE_PROCESSOR,
    MODEL_NAME,
    do_classifier_free_guidance,
    embeds_input,
    guidance_scale,
    guidance_scale_input,
    image_processor_for_vae,
    resolve_size,
)

__all__ = [
    "ZImageTextEncoderStep",
    "ZImageVaeEncoderStep",
    "PROMPT_INPUTS",
]

# What the prompt encoding reads, as the check-inputs step declares it too.
PROMPT_INPUTS = (
    InputParam.template("prompt"),
    InputParam.template("negative_prompt"),
    embeds_input("prompt_embeds"),
    embeds_input("negative_prompt_embeds"),
    guidance_scale_input(),
)


def _embeds_output(name: str) -> OutputParam:
    return OutputParam.template(
        name, type_hint=list[torch.Tensor], note="one [seq_len, dim] tensor per prompt"
    )


class ZImageTextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt, and the negative prompt when guidance is on, with the Qwen3 text encoder."""

    model_name = MODEL_NAME

    description = (
        "Wraps each prompt in the tokenizer's chat template (a user turn and the assistant's generation "
        "prompt), tokenizes it padded to max_sequence_length, and keeps the text encoder's second-to-last "
        "hidden states of the real tokens: one [seq_len, dim] tensor per prompt. With guidance_scale > 0 "
        "the negative prompt (empty by default) is encoded the same way. Precomputed embeddings are used as given."
    )

    expected_components = [
        ComponentSpec("text_encoder", "transformers.PreTrainedModel"),
        ComponentSpec("tokenizer", "transformers.Qwen2Tokenizer"),
    ]

    inputs = [
        *PROMPT_INPUTS,
        InputParam(
            "max_sequence_length",
            type_hint=int,
            default=512,
            description="Tokens per prompt, chat template included (longer prompts are cut).",
        ),
    ]

    intermediate_outputs = [_embeds_output("prompt_embeds"), _embeds_output("negative_prompt_embeds")]

    @staticmethod
    def encode(components, texts: list[str], device: torch.device, max_length: int) -> list[torch.Tensor]:
        """The embeddings of `texts`: one [tokens, dim] tensor each, padding dropped."""
        tokenizer = components.tokenizer
        templated = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                tokenize=False,
                add_generation_prompt=True,
                enable_thinking=True,
            )
            for text in texts
        ]
        tokens = tokenizer(
            templated, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
        )
        ids = tokens.input_ids.to(device)
        mask = tokens.attention_mask.to(device).bool()
        hidden = components.text_encoder(
            input_ids=ids, attention_mask=mask, output_hidden_states=True
        ).hidden_states[-2]
        return [hidden[i][mask[i]] for i in range(len(hidden))]

    def _negative_texts(self, negative_prompt, count: int) -> list[str]:
        if negative_prompt is None:
            return [""] * count
        texts = as_list(negative_prompt)
        if len(texts) != count:
            msg = (
                f"{type(self).__name__}: negative_prompt needs one entry per prompt (got {len(texts)} negative "
                f"prompts for {count} prompts); pass a list of {count}"
            )
            raise ValueError(msg)
        return texts

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        prompt, prompt_embeds = block_state.prompt, block_state.prompt_embeds
        check_prompt_or_embeds(self, prompt, prompt_embeds)
        guided = do_classifier_free_guidance(guidance_scale(components, block_state.guidance_scale))
        negative_prompt_embeds = block_state.negative_prompt_embeds
        device = components._execution_device
        if prompt is None:
            if guided and negative_prompt_embeds is None:
                msg = (
                    f"{type(self).__name__}: with prompt_embeds and guidance_scale > 0, negative_prompt_embeds "
                    "is needed too; pass it, or guidance_scale=0"
                )
                raise ValueError(msg)
        else:
            texts = as_list(prompt)
            negative_texts = self._negative_texts(block_state.negative_prompt, len(texts)) if guided else []
            prompt_embeds = self.encode(components, texts, device, block_state.max_sequence_length)
            if guided and negative_prompt_embeds is None:
                negative_prompt_embeds = self.encode(
                    components, negative_texts, device, block_state.max_sequence_length
                )
        block_state.prompt_embeds = list(prompt_embeds)
        block_state.negative_prompt_embeds = list(negative_prompt_embeds) if guided else None
        self.set_block_state(state, block_state)
        return components, state


class ZImageVaeEncoderStep(ModularPipelineBlocks):
    """Image-to-image: preprocess the reference image and encode it to normalized VAE latents."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` (to a multiple of 16 pixels, in [-1, 1]); height and width default to its "
        "size. Unless `latents` are given, encodes it with the VAE into image_latents, shifted and scaled "
        "as the transformer sees latents. An image with the transformer's channel count is taken as latents."
    )

    expected_components = [
        ComponentSpec("vae", "diffusers.AutoencoderKL"),
        ComponentSpec("transformer", "diffusers.ZImageTransformer2DModel"),
        IMAGE_PROCESSOR,
    ]

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("height"),
        InputParam.template("width"),
        InputParam.template("latents"),
        InputParam.template("generator"),
        DTYPE,
    ]

    intermediate_outputs = [
        tensor_output("image_latents", "Normalized VAE latents of the image (None when latents are given)."),
        *HEIGHT_WIDTH_OUTPUTS,
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        image = image_processor_for_vae(components).preprocess(block_state.image).to(dtype=torch.float32)
        height = image.shape[-2] if block_state.height is None else block_state.height
        width = image.shape[-1] if block_state.width is None else block_state.width
        block_state.height, block_state.width = resolve_size(self, components, height, width)
        image_latents = None
        if block_state.latents is None:
            dtype = block_state.dtype or components.vae.dtype
            image = image.to(device=components._execution_device, dtype=dtype)
            if image.shape[1] == components.transformer.config.in_channels:
                image_latents = image
            else:
                image_latents = encode_shifted_latents(components.vae, image, block_state.generator)
        block_state.image_latents = image_latents
        self.set_block_state(state, block_state)
        return components, state
