"""Prompt encoding with Qwen2.5-VL: the prompt in the family's system template, the last hidden states of its
tokens (the template's prefix dropped), padded to the longest prompt and marked by a mask.

Text-to-image reads text through the tokenizer; edit reads text and the input image through the processor, so
the vision tower's tokens of the image sit inside the prompt's sequence.
"""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.prompts import as_list, check_prompt_or_embeds, negative_texts
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    MAX_SEQUENCE_LENGTH,
    MODEL_NAME,
    embeds_input,
    guidance_on,
    mask_input,
    true_cfg_scale,
    true_cfg_scale_input,
)

__all__ = [
    "PROMPT_INPUTS",
    "TEXT2IMAGE_TEMPLATE",
    "EDIT_TEMPLATE",
    "QwenImageTextEncoderStep",
    "QwenImageEditTextEncoderStep",
    "encode_masked",
]

# The classic pipelines' system prompts, and how many tokens of each templated prompt come before the user's
# text (34 and 64 with the real tokenizer); those are dropped from the embeddings.
TEXT2IMAGE_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
TEXT2IMAGE_DROP = 34
EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
EDIT_DROP = 64

PROMPT_INPUTS = (
    InputParam.template("prompt"),
    InputParam.template("negative_prompt"),
    embeds_input("prompt_embeds"),
    mask_input("prompt_embeds_mask"),
    embeds_input("negative_prompt_embeds"),
    mask_input("negative_prompt_embeds_mask"),
    true_cfg_scale_input(),
)

_TEXT_ENCODER = ComponentSpec("text_encoder", "transformers.Qwen2_5_VLForConditionalGeneration")


def _outputs() -> list[OutputParam]:
    def embeds(name: str) -> OutputParam:
        return OutputParam.template(name, type_hint=torch.Tensor, note="[prompts, seq_len, dim], padded")

    def mask(name: str) -> OutputParam:
        return OutputParam(
            name, type_hint=torch.Tensor, description="[prompts, seq_len]: 1 a token, 0 padding"
        )

    return [
        embeds("prompt_embeds"),
        mask("prompt_embeds_mask"),
        embeds("negative_prompt_embeds"),
        mask("negative_prompt_embeds_mask"),
    ]


def encode_masked(
    text_encoder: Any, model_inputs: Any, drop: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The text encoder's last hidden states of each sequence's tokens after the first `drop`, zero-padded to
    the longest: embeddings [B, L, D] in `dtype` and the mask [B, L] (int64, 1 for tokens), as the classic."""
    mask = model_inputs["attention_mask"]
    outputs = text_encoder(
        input_ids=model_inputs["input_ids"],
        attention_mask=mask,
        pixel_values=model_inputs.get("pixel_values"),
        image_grid_thw=model_inputs.get("image_grid_thw"),
        output_hidden_states=True,
    )
    hidden = outputs.hidden_states[-1]
    valid = mask.bool()
    kept = [chunk[drop:] for chunk in torch.split(hidden[valid], valid.sum(dim=1).tolist(), dim=0)]
    longest = max(chunk.size(0) for chunk in kept)
    embeds = torch.stack([torch.cat([u, u.new_zeros(longest - u.size(0), u.size(1))]) for u in kept])
    ones = [torch.ones(chunk.size(0), dtype=torch.long, device=chunk.device) for chunk in kept]
    masks = torch.stack([torch.cat([u, u.new_zeros(longest - u.size(0))]) for u in ones])
    return embeds.to(dtype=dtype, device=device), masks


class _PromptEncoderStep(ModularPipelineBlocks):
    """Encodes the prompt, and the negative prompt when true CFG is on; precomputed embeddings pass through."""

    model_name = MODEL_NAME

    intermediate_outputs = _outputs()

    def encode(
        self, components: Any, block_state: Any, texts: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(
            f"{type(self).__name__} must implement encode(components, block_state, texts)"
        )

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        bs = block_state
        check_prompt_or_embeds(self, bs.prompt, bs.prompt_embeds)
        has_negative = bs.negative_prompt is not None or bs.negative_prompt_embeds is not None
        guided = guidance_on(true_cfg_scale(components, bs.true_cfg_scale), has_negative)
        if bs.prompt is not None:
            texts = as_list(bs.prompt)
            negatives = negative_texts(self, bs.negative_prompt, len(texts)) if guided else None
            bs.prompt_embeds, bs.prompt_embeds_mask = self.encode(components, bs, texts)
            if negatives is not None and bs.negative_prompt_embeds is None:
                bs.negative_prompt_embeds, bs.negative_prompt_embeds_mask = self.encode(
                    components, bs, negatives
                )
        elif guided and bs.negative_prompt_embeds is None:
            bs.negative_prompt_embeds, bs.negative_prompt_embeds_mask = self.encode(
                components, bs, negative_texts(self, bs.negative_prompt, bs.prompt_embeds.shape[0])
            )
        if not guided:
            bs.negative_prompt_embeds = bs.negative_prompt_embeds_mask = None
        self.set_block_state(state, bs)
        return components, state


class QwenImageTextEncoderStep(_PromptEncoderStep):
    """Text-to-image: encode the prompts (and negative prompts) with Qwen2.5-VL's language model."""

    description = (
        "Wraps each prompt in Qwen-Image's system template, tokenizes the batch padded to its longest (at most "
        "1024 prompt tokens), and keeps the text encoder's last hidden states of each prompt's tokens after the "
        "template's first 34: prompt_embeds [prompts, seq_len, dim] padded with zeros, and prompt_embeds_mask. "
        "With true_cfg_scale > 1 and a negative prompt, the negative prompt is encoded the same way. Precomputed "
        "embeddings (and masks) are used as given."
    )

    expected_components = [_TEXT_ENCODER, ComponentSpec("tokenizer", "transformers.Qwen2Tokenizer")]

    inputs = list(PROMPT_INPUTS)

    def encode(self, components, block_state, texts):
        device = components._execution_device
        templated = [TEXT2IMAGE_TEMPLATE.format(text) for text in texts]
        tokens = components.tokenizer(
            templated,
            max_length=MAX_SEQUENCE_LENGTH + TEXT2IMAGE_DROP,
            padding=True,
            truncation=True,
            return_tensors="pt",
        ).to(device)
        encoder = components.text_encoder
        return encode_masked(encoder, tokens, TEXT2IMAGE_DROP, encoder.dtype, device)


class QwenImageEditTextEncoderStep(_PromptEncoderStep):
    """Edit: encode each prompt with the input image through Qwen2.5-VL (vision tower and language model)."""

    description = (
        "Wraps each prompt in Qwen-Image-Edit's system template, whose user turn holds the image, and runs the "
        "processor (the image's vision tokens, the text padded to the longest) and the text encoder with the "
        "image's pixels: the last hidden states of each sequence after its first 64 tokens, padded, and their "
        "mask. The negative prompt (with true CFG) is encoded with the same image. Precomputed embeddings are "
        "used as given."
    )

    expected_components = [_TEXT_ENCODER, ComponentSpec("processor", "transformers.Qwen2VLProcessor")]

    inputs = [
        *PROMPT_INPUTS,
        InputParam(
            "prompt_image",
            type_hint=Any,
            description="The input image resized for the edit (made by the resize step), as the text encoder sees it.",
        ),
    ]

    def encode(self, components, block_state, texts):
        device = components._execution_device
        templated = [EDIT_TEMPLATE.format(text) for text in texts]
        model_inputs = components.processor(
            text=templated, images=block_state.prompt_image, padding=True, return_tensors="pt"
        ).to(device)
        encoder = components.text_encoder
        return encode_masked(encoder, model_inputs, EDIT_DROP, encoder.dtype, device)
