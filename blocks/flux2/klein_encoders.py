"""Flux.2 Klein's prompt steps: Qwen3 prompt encoding (the empty negative prompt too, for true CFG), and the
step that repeats both embeddings per image with their text ids."""

from __future__ import annotations

import logging
from typing import Any

import torch

from blocks.common.batch import repeat_per_image
from blocks.common.guidance import guidance_scale_of
from blocks.common.params import BATCH_SIZE_OUTPUT, DTYPE_OUTPUT
from blocks.common.prompts import as_list, check_prompt_or_embeds
from modular import ComponentSpec, ConfigSpec, InputParam, ModularPipelineBlocks, OutputParam, PipelineState

from .encoders import check_out_layers
from .utils import MODEL_NAME, text_ids

__all__ = [
    "IS_DISTILLED",
    "KLEIN_GUIDANCE_SCALE",
    "KLEIN_PROMPT_INPUTS",
    "Flux2KleinInputStep",
    "Flux2KleinTextEncoderStep",
    "klein_guided",
    "klein_guidance_scale_input",
]

logger = logging.getLogger(__name__)

KLEIN_GUIDANCE_SCALE = 4.0  # the classic pipeline's default
IS_DISTILLED = ConfigSpec(
    "is_distilled", False, "A step-distilled Klein: no classifier-free guidance, whatever the scale."
)


def klein_guidance_scale_input() -> InputParam:
    """``guidance_scale``: true classifier-free guidance above 1, defaulting to the guider's own."""
    return InputParam.template(
        "guidance_scale",
        default=None,
        description=(
            "Classifier-free guidance scale: pred = neg + scale * (pos - neg), run above 1 (never for a "
            f"distilled Klein). Default: the guider's own ({KLEIN_GUIDANCE_SCALE} for the default guider)."
        ),
    )


def klein_guided(components: Any, given: float | None) -> tuple[float, bool]:
    """The call's guidance scale and whether classifier-free guidance runs: above 1, and not distilled."""
    scale = guidance_scale_of(components, given, KLEIN_GUIDANCE_SCALE)
    return scale, scale > 1 and not getattr(components, "is_distilled", False)


KLEIN_PROMPT_INPUTS = (
    InputParam.template("prompt"),
    InputParam.template("prompt_embeds", note="[B, seq_len, layers * dim]"),
    InputParam.template(
        "negative_prompt_embeds", note="[B, seq_len, layers * dim]; default: the empty prompt's"
    ),
    klein_guidance_scale_input(),
    InputParam(
        "max_sequence_length",
        type_hint=int,
        default=512,
        description="Tokens per prompt, chat template included (longer prompts are cut).",
    ),
    InputParam(
        "text_encoder_out_layers",
        type_hint=tuple,
        default=(9, 18, 27),
        description="The text encoder layers whose hidden states are stacked into the prompt embeddings.",
    ),
)


class Flux2KleinTextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt with Qwen3, and the empty negative prompt when classifier-free guidance runs."""

    model_name = MODEL_NAME

    description = (
        "Wraps each prompt in the tokenizer's chat template (a user turn, the generation prompt, thinking off), "
        "tokenizes it padded to max_sequence_length, runs the text encoder and stacks the hidden states of "
        "text_encoder_out_layers (default 9, 18, 27) per token: prompt_embeds [B, seq_len, layers * dim]. With "
        "guidance (guidance_scale > 1, not distilled) the empty prompt is encoded as negative_prompt_embeds, "
        "one per prompt. Precomputed embeddings are used as given."
    )

    expected_components = [
        ComponentSpec("text_encoder", "transformers.Qwen3ForCausalLM"),
        ComponentSpec("tokenizer", "transformers.Qwen2Tokenizer"),
    ]

    expected_configs = [IS_DISTILLED]

    inputs = list(KLEIN_PROMPT_INPUTS)

    intermediate_outputs = [
        OutputParam.template("prompt_embeds", note="[B, seq_len, layers * dim]"),
        OutputParam.template("negative_prompt_embeds", note="None without guidance"),
    ]

    @staticmethod
    def encode(components: Any, prompts: list[str], max_length: int, layers: tuple[int, ...]) -> torch.Tensor:
        """The embeddings [len(prompts), max_length, len(layers) * dim] of `prompts`."""
        tokenizer, text_encoder = components.tokenizer, components.text_encoder
        ids, masks = [], []
        for prompt in prompts:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}],
                tokenize=False,
                add_generation_prompt=True,
                enable_thinking=False,
            )
            tokens = tokenizer(
                text, return_tensors="pt", padding="max_length", truncation=True, max_length=max_length
            )
            ids.append(tokens["input_ids"])
            masks.append(tokens["attention_mask"])
        device = components._execution_device
        output = text_encoder(
            input_ids=torch.cat(ids, dim=0).to(device),
            attention_mask=torch.cat(masks, dim=0).to(device),
            output_hidden_states=True,
            use_cache=False,
        )
        stacked = torch.stack([output.hidden_states[k] for k in layers], dim=1)
        stacked = stacked.to(dtype=text_encoder.dtype, device=device)
        batch, count, length, dim = stacked.shape
        return stacked.permute(0, 2, 1, 3).reshape(batch, length, count * dim)

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        check_prompt_or_embeds(self, block_state.prompt, block_state.prompt_embeds)
        layers = tuple(block_state.text_encoder_out_layers)
        length = block_state.max_sequence_length
        if block_state.prompt_embeds is None:
            check_out_layers(self, components, layers)
            block_state.prompt_embeds = self.encode(components, as_list(block_state.prompt), length, layers)
        scale, guided = klein_guided(components, block_state.guidance_scale)
        if scale > 1 and getattr(components, "is_distilled", False):
            logger.warning(
                "guidance_scale %s is ignored: the pipeline is step-distilled (is_distilled)", scale
            )
        if not guided:
            block_state.negative_prompt_embeds = None
        elif block_state.negative_prompt_embeds is None:
            check_out_layers(self, components, layers)
            count = block_state.prompt_embeds.shape[0]
            block_state.negative_prompt_embeds = self.encode(components, [""] * count, length, layers)
        self.set_block_state(state, block_state)
        return components, state


def _ids_output(name: str, description: str) -> OutputParam:
    return OutputParam(
        name, type_hint=torch.Tensor, kwargs_type="denoiser_input_fields", description=description
    )


class Flux2KleinInputStep(ModularPipelineBlocks):
    """Count the prompts, repeat both embeddings for num_images_per_prompt, make their position ids."""

    model_name = MODEL_NAME

    description = (
        "Reads batch_size (number of prompts) and dtype from prompt_embeds, repeats prompt_embeds and "
        "negative_prompt_embeds (when given) num_images_per_prompt times per prompt, and makes text_ids and "
        "negative_text_ids [B, seq_len, 4], the (0, 0, 0, index) position of each text token."
    )

    inputs = [
        InputParam.template("num_images_per_prompt"),
        InputParam.template("prompt_embeds", required=True),
        InputParam.template("negative_prompt_embeds"),
    ]

    intermediate_outputs = [
        BATCH_SIZE_OUTPUT,
        DTYPE_OUTPUT,
        OutputParam.template("prompt_embeds", note="repeated per image"),
        OutputParam.template("negative_prompt_embeds", note="repeated per image; None without guidance"),
        _ids_output("text_ids", "Position ids of the text tokens, [B, seq_len, 4]."),
        _ids_output("negative_text_ids", "Position ids of the negative text tokens; None without guidance."),
    ]

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        count, device = block_state.num_images_per_prompt, components._execution_device
        embeds = block_state.prompt_embeds
        block_state.batch_size, block_state.dtype = embeds.shape[0], embeds.dtype
        block_state.prompt_embeds = repeat_per_image(embeds, count)
        block_state.text_ids = text_ids(*block_state.prompt_embeds.shape[:2]).to(device)
        negative = block_state.negative_prompt_embeds
        block_state.negative_text_ids = None
        if negative is not None:
            if negative.shape[0] != embeds.shape[0]:
                msg = (
                    f"{type(self).__name__}: negative_prompt_embeds holds {negative.shape[0]} prompts for "
                    f"{embeds.shape[0]} in prompt_embeds; pass one per prompt"
                )
                raise ValueError(msg)
            block_state.negative_prompt_embeds = repeat_per_image(negative, count)
            block_state.negative_text_ids = text_ids(*block_state.negative_prompt_embeds.shape[:2]).to(device)
        self.set_block_state(state, block_state)
        return components, state
