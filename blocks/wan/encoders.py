"""Encoder steps: UMT5 prompt encoding, and Wan 2.1 image-to-video's CLIP image encoding."""

from __future__ import annotations

import attrs
import torch

from blocks.common.prompts import as_list, check_prompt_or_embeds, negative_texts
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .inputs import IMAGE_EMBEDS
from .utils import (
    MODEL_NAME,
    clean_prompts,
    denoiser,
    do_classifier_free_guidance,
    guidance_scale,
    guidance_scale_input,
)

__all__ = ["FIRST_FRAME", "LAST_FRAME", "PROMPT_INPUTS", "WanImageEncoderStep", "WanTextEncoderStep"]

# What the prompt encoding reads, as the check-inputs step declares it too.
PROMPT_INPUTS = (
    InputParam.template("prompt"),
    InputParam.template("negative_prompt"),
    InputParam.template("prompt_embeds", note="[batch, seq_len, dim], zero past each prompt's tokens"),
    InputParam.template("negative_prompt_embeds"),
    guidance_scale_input(),
)

# The frames image-to-video starts from, as every step that reads them declares them.
FIRST_FRAME = InputParam.template("image", description="The first frame of the video.")
LAST_FRAME = InputParam.template(
    "image", name="last_image", description="The last frame of the video (optional)."
)

IMAGE_ENCODER = ComponentSpec(
    "image_encoder",
    "transformers.CLIPVisionModel",
    description="Wan 2.1 image-to-video: the CLIP vision model whose hidden states condition the transformer.",
)
IMAGE_PROCESSOR = ComponentSpec(
    "image_processor",
    "transformers.CLIPImageProcessor",
    description="Wan 2.1 image-to-video: the CLIP image processor of the image encoder.",
)


class WanTextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt, and the negative prompt when guidance is on, with the UMT5 text encoder."""

    model_name = MODEL_NAME

    description = (
        "Cleans each prompt (ftfy, HTML entities, whitespace), tokenizes it padded to max_sequence_length and "
        "keeps the text encoder's last hidden states of the real tokens, zero past them: [batch, "
        "max_sequence_length, dim] in the transformer's dtype. With guidance_scale > 1 the negative prompt "
        "(empty by default) is encoded the same way. Precomputed embeddings are used as given."
    )

    expected_components = [
        ComponentSpec("text_encoder", "transformers.UMT5EncoderModel"),
        ComponentSpec("tokenizer", "transformers.AutoTokenizer"),
    ]

    inputs = [
        *PROMPT_INPUTS,
        InputParam(
            "max_sequence_length",
            type_hint=int,
            default=512,
            description="Tokens per prompt (longer prompts are cut, shorter ones padded with zeros).",
        ),
    ]

    intermediate_outputs = [
        OutputParam.template("prompt_embeds", note="[batch, seq_len, dim]"),
        OutputParam.template("negative_prompt_embeds", note="[batch, seq_len, dim]; None without guidance"),
    ]

    @staticmethod
    def encode(components, texts: list[str], device: torch.device, max_length: int) -> torch.Tensor:
        """The embeddings of `texts`: [len(texts), max_length, dim], zero past each text's tokens."""
        tokens = components.tokenizer(
            clean_prompts(texts),
            padding="max_length",
            max_length=max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = tokens.attention_mask
        lengths = mask.gt(0).sum(dim=1).long()
        encoder = components.text_encoder
        hidden = encoder(tokens.input_ids.to(device), mask.to(device)).last_hidden_state
        hidden = hidden.to(dtype=encoder.dtype, device=device)
        kept = [row[:length] for row, length in zip(hidden, lengths, strict=True)]
        return torch.stack(
            [torch.cat([row, row.new_zeros(max_length - row.size(0), row.size(1))]) for row in kept]
        )

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        prompt, prompt_embeds = block_state.prompt, block_state.prompt_embeds
        check_prompt_or_embeds(self, prompt, prompt_embeds)
        guided = do_classifier_free_guidance(guidance_scale(components, block_state.guidance_scale))
        negative_prompt_embeds = block_state.negative_prompt_embeds
        device = components._execution_device
        length = block_state.max_sequence_length
        if prompt_embeds is None:
            prompt_embeds = self.encode(components, as_list(prompt), device, length)
        count = prompt_embeds.shape[0]
        if guided and negative_prompt_embeds is None:
            # As the classic pipelines: the negative prompt (empty by default), also beside given prompt_embeds.
            negative_prompt_embeds = self.encode(
                components, negative_texts(self, block_state.negative_prompt or "", count), device, length
            )
        dtype = denoiser(components).dtype
        block_state.prompt_embeds = prompt_embeds.to(dtype)
        block_state.negative_prompt_embeds = negative_prompt_embeds.to(dtype) if guided else None
        self.set_block_state(state, block_state)
        return components, state


class WanImageEncoderStep(ModularPipelineBlocks):
    """Wan 2.1 image-to-video: the CLIP hidden states of the first (and last) frame, for the transformer."""

    model_name = MODEL_NAME

    description = (
        "When the transformer reads image embeddings (its config's image_dim is set, as in Wan 2.1 "
        "image-to-video), encodes `image` (and `last_image`) with the CLIP image encoder and keeps its "
        "second-to-last hidden states, unless image_embeds are given. Wan 2.2 repos have no image encoder "
        "(listed as absent in their index) and skip this."
    )

    # Reads the transformer's config (image_dim) without declaring it: the plan lists models in the order they run.
    expected_components = [IMAGE_ENCODER, IMAGE_PROCESSOR]
    optional_components = ("image_encoder", "image_processor")

    inputs = [attrs.evolve(FIRST_FRAME, required=True), LAST_FRAME, IMAGE_EMBEDS]

    intermediate_outputs = [
        OutputParam("image_embeds", type_hint=torch.Tensor, description="CLIP hidden states of the frame(s).")
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        transformer = denoiser(components)
        if transformer.config.image_dim is None:
            block_state.image_embeds = None
        elif block_state.image_embeds is None:
            encoder = components.image_encoder
            if encoder is None or components.image_processor is None:
                msg = (
                    f"{type(self).__name__}: the transformer reads image embeddings (image_dim "
                    f"{transformer.config.image_dim}), but the pipeline has no image_encoder and image_processor; "
                    "load them, or pass image_embeds"
                )
                raise ValueError(msg)
            images = (
                block_state.image
                if block_state.last_image is None
                else [block_state.image, block_state.last_image]
            )
            pixels = components.image_processor(images=images, return_tensors="pt").to(encoder.device)
            hidden = encoder(**pixels, output_hidden_states=True).hidden_states[-2]
            block_state.image_embeds = hidden.to(components._execution_device)
        self.set_block_state(state, block_state)
        return components, state
