"""The prompt encoder: CLIP-L and CLIP-G (per token and pooled) beside T5 (per token), as SD3 reads them.

The per-token embeddings are ``cat([pad(cat([clip_l, clip_g], -1)), t5], -2)``: the two CLIP encoders' hidden
states side by side, zero-padded to T5's width, then T5's tokens after them, [B, 77 + max_sequence_length, D].
The pooled embedding is the two CLIP encoders' projected outputs side by side. A repo without T5
(``text_encoder_3`` absent) gets zeros in T5's place, as the classic pipelines do.
"""

from __future__ import annotations

import logging

import torch

from blocks.common.lora_scale import lora_scale_from, lora_scaled_encoders
from blocks.common.prompts import as_list, check_prompt_or_embeds, negative_texts
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, do_classifier_free_guidance, guidance_scale, guidance_scale_input, pooled_input

__all__ = ["MAX_SEQUENCE_LENGTH", "PROMPT_INPUTS", "StableDiffusion3TextEncoderStep"]

logger = logging.getLogger(__name__)

MAX_SEQUENCE_LENGTH = 512  # T5's limit

_TEXT = str | list[str]


def _text_input(name: str, description: str) -> InputParam:
    return InputParam(name, type_hint=_TEXT, description=description)


# What the prompt encoding reads, as the check-inputs step declares it too.
PROMPT_INPUTS = (
    InputParam.template("prompt"),
    _text_input("prompt_2", "The prompt for CLIP-G (text_encoder_2); default: prompt."),
    _text_input("prompt_3", "The prompt for T5 (text_encoder_3); default: prompt."),
    InputParam.template("negative_prompt", note="used with guidance_scale > 1; default ''"),
    _text_input("negative_prompt_2", "The negative prompt for CLIP-G; default: negative_prompt."),
    _text_input("negative_prompt_3", "The negative prompt for T5; default: negative_prompt."),
    InputParam.template("prompt_embeds", note="[B, 77 + max_sequence_length, D]"),
    pooled_input("pooled_prompt_embeds"),
    InputParam.template("negative_prompt_embeds"),
    pooled_input("negative_pooled_prompt_embeds"),
    guidance_scale_input(),
    InputParam(
        "max_sequence_length",
        type_hint=int,
        default=256,
        description=f"The T5 token count (at most {MAX_SEQUENCE_LENGTH}).",
    ),
)

_T5 = ("text_encoder_3", "tokenizer_3")


def _pooled_output(name: str, description: str) -> OutputParam:
    return OutputParam(
        name, type_hint=torch.Tensor, kwargs_type="denoiser_input_fields", description=description
    )


class StableDiffusion3TextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt with CLIP-L, CLIP-G and T5; the negative prompt too when guidance is on."""

    model_name = MODEL_NAME

    description = (
        "Encodes `prompt` with CLIP-L, `prompt_2` (default: prompt) with CLIP-G and `prompt_3` (default: prompt) "
        "with T5 into prompt_embeds [B, 77 + max_sequence_length, D] (the CLIP hidden states, the penultimate "
        "layer's or clip_skip layers further back, side by side and zero-padded to T5's width, then T5's) and "
        "pooled_prompt_embeds [B, D_L + D_G]. Without a T5 encoder its part is zeros. With guidance_scale > 1 "
        "the negative prompts (default '') are encoded the same way, without clip_skip, as the classic "
        "pipelines do. Precomputed embeddings are used as given. joint_attention_kwargs['scale'] scales the "
        "CLIP encoders' LoRA layers while they run."
    )

    expected_components = [
        ComponentSpec("text_encoder", "transformers.CLIPTextModelWithProjection"),
        ComponentSpec("tokenizer", "transformers.CLIPTokenizer"),
        ComponentSpec("text_encoder_2", "transformers.CLIPTextModelWithProjection"),
        ComponentSpec("tokenizer_2", "transformers.CLIPTokenizer"),
        ComponentSpec("text_encoder_3", "transformers.T5EncoderModel"),
        ComponentSpec("tokenizer_3", "transformers.T5TokenizerFast"),
    ]
    # T5 may be absent from a repo ([null, null] in its index): the step runs without it, zeros in its place.
    optional_components = _T5

    inputs = [
        *PROMPT_INPUTS,
        InputParam("clip_skip", type_hint=int, description="CLIP layers to skip before the penultimate one."),
        InputParam(
            "joint_attention_kwargs",
            type_hint=dict,
            description="Extra keyword arguments for the attention processors ('scale': the LoRA scale).",
        ),
    ]

    intermediate_outputs = [
        OutputParam.template("prompt_embeds"),
        _pooled_output("pooled_prompt_embeds", "Pooled CLIP-L and CLIP-G embeddings of the prompt."),
        OutputParam.template("negative_prompt_embeds", note="None without guidance"),
        _pooled_output(
            "negative_pooled_prompt_embeds",
            "Pooled embeddings of the negative prompt; None without guidance.",
        ),
    ]

    @staticmethod
    def _clip(components, index: int, texts: list[str], device, clip_skip: int | None):
        """CLIP encoder `index` (0: CLIP-L, 1: CLIP-G): hidden states [B, 77, D] and the pooled projection [B, D]."""
        tokenizer = (components.tokenizer, components.tokenizer_2)[index]
        text_encoder = (components.text_encoder, components.text_encoder_2)[index]
        max_length = components.tokenizer.model_max_length  # the classic pipelines' one length for both
        ids = tokenizer(
            texts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
        ).input_ids
        output = text_encoder(ids.to(device), output_hidden_states=True)
        pooled = output[0]
        hidden = output.hidden_states[-2 if clip_skip is None else -(clip_skip + 2)]
        return hidden.to(dtype=components.text_encoder.dtype, device=device), pooled

    @staticmethod
    def _t5(components, texts: list[str], max_length: int, device) -> torch.Tensor:
        text_encoder = getattr(components, "text_encoder_3", None)
        tokenizer = getattr(components, "tokenizer_3", None)
        if text_encoder is None or tokenizer is None:
            width = components.transformer.config.joint_attention_dim
            return torch.zeros(
                (len(texts), max_length, width), device=device, dtype=components.text_encoder.dtype
            )
        ids = tokenizer(
            texts,
            padding="max_length",
            max_length=max_length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        ).input_ids
        full = tokenizer(texts, padding="longest", return_tensors="pt").input_ids
        if full.shape[-1] > ids.shape[-1]:
            logger.warning("T5 prompt truncated to max_sequence_length=%d tokens", max_length)
        embeds = text_encoder(ids.to(device))[0]
        return embeds.to(dtype=text_encoder.dtype, device=device)

    def _encode(self, components, texts, texts_2, texts_3, max_length, device, clip_skip):
        """The per-token and pooled embeddings of one prompt set (lists of equal length)."""
        clip_l, pooled_l = self._clip(components, 0, texts, device, clip_skip)
        clip_g, pooled_g = self._clip(components, 1, texts_2, device, clip_skip)
        clip = torch.cat([clip_l, clip_g], dim=-1)
        t5 = self._t5(components, texts_3, max_length, device)
        clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return torch.cat([clip, t5], dim=-2), torch.cat([pooled_l, pooled_g], dim=-1)

    def _check(self, bs) -> None:
        name = type(self).__name__
        check_prompt_or_embeds(self, bs.prompt, bs.prompt_embeds)
        for kind in ("", "negative_"):
            if (
                getattr(bs, f"{kind}prompt_embeds") is not None
                and getattr(bs, f"{kind}pooled_prompt_embeds") is None
            ):
                msg = (
                    f"{name}: {kind}prompt_embeds need {kind}pooled_prompt_embeds from the same CLIP encoders "
                    f"(got {kind}prompt_embeds only); pass both"
                )
                raise ValueError(msg)
        if bs.max_sequence_length > MAX_SEQUENCE_LENGTH:
            msg = f"{name}: max_sequence_length must be at most {MAX_SEQUENCE_LENGTH} (got {bs.max_sequence_length})"
            raise ValueError(msg)

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        self._check(block_state)
        scale = lora_scale_from(
            block_state.joint_attention_kwargs, "joint_attention_kwargs", type(self).__name__
        )
        with lora_scaled_encoders([components.text_encoder, components.text_encoder_2], scale):
            self._encode_prompts(components, block_state)
        self.set_block_state(state, block_state)
        return components, state

    def _encode_prompts(self, components, bs) -> None:
        device = components._execution_device
        max_length = bs.max_sequence_length
        if bs.prompt_embeds is None:
            texts = as_list(bs.prompt)
            # `or`, as the classic pipelines: an empty prompt_2 falls back to the prompt too.
            texts_2 = as_list(bs.prompt_2 or bs.prompt)
            texts_3 = as_list(bs.prompt_3 or bs.prompt)
            embeds, pooled = self._encode(
                components, texts, texts_2, texts_3, max_length, device, bs.clip_skip
            )
            count = len(texts)
        else:
            embeds, pooled = bs.prompt_embeds.to(device), bs.pooled_prompt_embeds.to(device)
            count = embeds.shape[0]
        negative = negative_pooled = None
        if do_classifier_free_guidance(guidance_scale(components, bs.guidance_scale)):
            if bs.negative_prompt_embeds is None:
                negative_1 = negative_texts(self, bs.negative_prompt or "", count)
                first = bs.negative_prompt or ""
                negative_2 = negative_texts(self, bs.negative_prompt_2 or first, count, "negative_prompt_2")
                negative_3 = negative_texts(self, bs.negative_prompt_3 or first, count, "negative_prompt_3")
                # The classic pipelines encode the negative prompts without clip_skip.
                negative, negative_pooled = self._encode(
                    components, negative_1, negative_2, negative_3, max_length, device, None
                )
            else:
                negative = bs.negative_prompt_embeds.to(device)
                negative_pooled = bs.negative_pooled_prompt_embeds.to(device)
            if negative.shape != embeds.shape:
                msg = (
                    f"{type(self).__name__}: negative_prompt_embeds must have the shape of prompt_embeds "
                    f"(got {tuple(negative.shape)} and {tuple(embeds.shape)})"
                )
                raise ValueError(msg)
        bs.prompt_embeds, bs.pooled_prompt_embeds = embeds, pooled
        bs.negative_prompt_embeds, bs.negative_pooled_prompt_embeds = negative, negative_pooled
