"""Encoder steps: the prompt with CLIP (pooled) and T5 (per token), the reference image (image-to-image)
and the control image (control workflows) with the VAE."""

from __future__ import annotations

import logging

import torch

from blocks.common.batch import check_generators
from blocks.common.lora_scale import lora_scale_from, lora_scaled_encoders
from blocks.common.params import BATCH_INPUTS, DTYPE, tensor_input, tensor_output
from blocks.common.prompts import as_list, check_prompt_or_embeds
from blocks.common.vae import encode_shifted_latents, retrieve_latents, shift_and_scale
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import IMAGE_PROCESSOR, LATENTS, MODEL_NAME, default_size, image_processor_for_vae, pack_latents

__all__ = [
    "CONTROL_IMAGE",
    "NEGATIVE_PROMPT",
    "PROMPT_2",
    "PROMPT_EMBEDS",
    "TRUE_CFG_SCALE",
    "FluxTextEncoderStep",
    "FluxVaeEncoderStep",
    "FluxControlImageEncoderStep",
]

logger = logging.getLogger(__name__)

MAX_SEQUENCE_LENGTH = 512

PROMPT_2 = InputParam(
    "prompt_2", type_hint=str | list[str], description="The prompt for T5 (default: prompt)."
)
NEGATIVE_PROMPT = InputParam.template("negative_prompt", note="used with true_cfg_scale > 1")
PROMPT_EMBEDS = InputParam.template("prompt_embeds", note="T5, [B, S, D]")
TRUE_CFG_SCALE = InputParam(
    "true_cfg_scale",
    type_hint=float,
    default=1.0,
    description="True classifier-free guidance scale; above 1 with a negative prompt runs it.",
)


class FluxTextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt with CLIP (pooled) and T5 (per token); the negative prompt too for true CFG."""

    model_name = MODEL_NAME

    description = (
        "Encodes `prompt` with CLIP into pooled_prompt_embeds [B, D] (the pooled output) and `prompt_2` "
        "(default: `prompt`) with T5 into prompt_embeds [B, max_sequence_length, D]; text_ids are their zero "
        "position ids. With true_cfg_scale > 1 and a negative prompt, the negative prompt is encoded the same "
        "way. Precomputed embeddings are used as given."
    )

    expected_components = [
        ComponentSpec("text_encoder", "transformers.CLIPTextModel"),
        ComponentSpec("tokenizer", "transformers.CLIPTokenizer"),
        ComponentSpec("text_encoder_2", "transformers.T5EncoderModel"),
        ComponentSpec("tokenizer_2", "transformers.T5Tokenizer"),
    ]

    @property
    def inputs(self) -> list[InputParam]:
        text = str | list[str]
        return [
            InputParam.template("prompt"),
            PROMPT_2,
            NEGATIVE_PROMPT,
            InputParam("negative_prompt_2", type_hint=text, description="The negative prompt for T5."),
            PROMPT_EMBEDS,
            tensor_input("pooled_prompt_embeds", "Precomputed pooled CLIP embeddings."),
            InputParam.template("negative_prompt_embeds"),
            tensor_input(
                "negative_pooled_prompt_embeds", "Precomputed pooled CLIP embeddings of the negative prompt."
            ),
            TRUE_CFG_SCALE,
            # Its "scale" is the LoRA scale, for the text encoders too (as in the classic pipelines).
            InputParam(
                "joint_attention_kwargs",
                type_hint=dict,
                description="Extra keyword arguments for the attention processors.",
            ),
            InputParam(
                "max_sequence_length",
                type_hint=int,
                default=MAX_SEQUENCE_LENGTH,
                description="The T5 token count (at most 512).",
            ),
        ]

    intermediate_outputs = [
        OutputParam.template("prompt_embeds", note="T5"),
        OutputParam(
            "pooled_prompt_embeds",
            type_hint=torch.Tensor,
            kwargs_type="denoiser_input_fields",
            description="Pooled CLIP embeddings of the prompt.",
        ),
        OutputParam(
            "text_ids",
            type_hint=torch.Tensor,
            kwargs_type="denoiser_input_fields",
            description="Position ids of the text tokens, [S, 3] zeros.",
        ),
        OutputParam.template("negative_prompt_embeds", note="T5; None without true CFG"),
        OutputParam(
            "negative_pooled_prompt_embeds",
            type_hint=torch.Tensor,
            kwargs_type="denoiser_input_fields",
            description="Pooled CLIP embeddings of the negative prompt; None without true CFG.",
        ),
    ]

    @staticmethod
    def _clip_pooled(components, text: list[str], device: torch.device) -> torch.Tensor:
        tokenizer, text_encoder = components.tokenizer, components.text_encoder
        ids = tokenizer(
            text,
            padding="max_length",
            max_length=tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids
        pooled = text_encoder(ids.to(device), output_hidden_states=False).pooler_output
        return pooled.to(dtype=text_encoder.dtype, device=device)

    @staticmethod
    def _t5(components, text: list[str], max_length: int, device: torch.device) -> torch.Tensor:
        tokenizer, text_encoder = components.tokenizer_2, components.text_encoder_2
        ids = tokenizer(
            text, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
        ).input_ids
        full = tokenizer(text, padding="longest", return_tensors="pt").input_ids
        if full.shape[-1] > ids.shape[-1]:
            logger.warning("T5 prompt truncated to max_sequence_length=%d tokens", max_length)
        embeds = text_encoder(ids.to(device), output_hidden_states=False)[0]
        return embeds.to(dtype=text_encoder.dtype, device=device)

    def _encode(self, components, prompt, prompt_2, max_length: int, device: torch.device):
        prompt = as_list(prompt)
        prompt_2 = prompt if prompt_2 is None else as_list(prompt_2)
        return self._t5(components, prompt_2, max_length, device), self._clip_pooled(
            components, prompt, device
        )

    def _check(self, block_state) -> None:
        name = type(self).__name__
        check_prompt_or_embeds(self, block_state.prompt, block_state.prompt_embeds)
        if block_state.prompt_embeds is not None and block_state.prompt_2 is not None:
            msg = f"{name}: prompt_2 is encoded into prompt_embeds; pass prompt_2 or prompt_embeds, not both"
            raise ValueError(msg)
        for kind in ("", "negative_"):
            if (
                getattr(block_state, f"{kind}prompt_embeds") is not None
                and getattr(block_state, f"{kind}pooled_prompt_embeds") is None
            ):
                msg = (
                    f"{name}: {kind}prompt_embeds need {kind}pooled_prompt_embeds from the same CLIP encoder "
                    f"(got {kind}prompt_embeds only); pass both"
                )
                raise ValueError(msg)
        if block_state.max_sequence_length > MAX_SEQUENCE_LENGTH:
            msg = f"{name}: max_sequence_length must be at most {MAX_SEQUENCE_LENGTH} (got {block_state.max_sequence_length})"
            raise ValueError(msg)

    def _check_negative(self, prompt, negative) -> None:
        name = type(self).__name__
        if prompt is None:
            return
        if type(prompt) is not type(negative):
            msg = (
                f"{name}: negative_prompt must have the type of prompt (got {type(negative).__name__} for a "
                f"{type(prompt).__name__} prompt); pass both as str or both as list"
            )
            raise TypeError(msg)
        if isinstance(prompt, list) and len(negative) != len(prompt):
            msg = (
                f"{name}: negative_prompt needs one entry per prompt "
                f"(got {len(negative)} negative prompts for {len(prompt)} prompts)"
            )
            raise ValueError(msg)

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        self._check(block_state)
        scale = lora_scale_from(
            block_state.joint_attention_kwargs, "joint_attention_kwargs", type(self).__name__
        )
        encoders = [getattr(components, "text_encoder", None), getattr(components, "text_encoder_2", None)]
        with lora_scaled_encoders(encoders, scale):
            self._encode_prompts(components, block_state)
        self.set_block_state(state, block_state)
        return components, state

    def _encode_prompts(self, components, block_state) -> None:
        device = components._execution_device
        max_length = block_state.max_sequence_length
        if block_state.prompt_embeds is None:
            embeds, pooled = self._encode(
                components, block_state.prompt, block_state.prompt_2, max_length, device
            )
        else:
            embeds, pooled = block_state.prompt_embeds.to(device), block_state.pooled_prompt_embeds.to(device)

        negative_embeds = negative_pooled = None
        has_negative = (
            block_state.negative_prompt is not None or block_state.negative_prompt_embeds is not None
        )
        if block_state.true_cfg_scale > 1 and has_negative:
            if block_state.negative_prompt_embeds is None:
                self._check_negative(block_state.prompt, block_state.negative_prompt)
                negative_embeds, negative_pooled = self._encode(
                    components, block_state.negative_prompt, block_state.negative_prompt_2, max_length, device
                )
            else:
                negative_embeds = block_state.negative_prompt_embeds.to(device)
                negative_pooled = block_state.negative_pooled_prompt_embeds.to(device)
            if negative_embeds.shape != embeds.shape:
                msg = (
                    f"{type(self).__name__}: negative_prompt_embeds must have the shape of prompt_embeds "
                    f"(got {tuple(negative_embeds.shape)} and {tuple(embeds.shape)})"
                )
                raise ValueError(msg)

        block_state.prompt_embeds, block_state.pooled_prompt_embeds = embeds, pooled
        block_state.negative_prompt_embeds = negative_embeds
        block_state.negative_pooled_prompt_embeds = negative_pooled
        block_state.text_ids = torch.zeros(embeds.shape[1], 3).to(
            device=device, dtype=components.text_encoder.dtype
        )


CONTROL_IMAGE = InputParam.template(
    "image",
    name="control_image",
    required=True,
    description="The control image (e.g. canny edges or a depth map) the control transformer follows.",
)


class FluxVaeEncoderStep(ModularPipelineBlocks):
    """Image-to-image: preprocess the reference image to height x width and encode it to Flux latents."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `image` to height x width (default 128 latent cells a side) in [-1, 1] and encodes it "
        "with the VAE into image_latents [N, C, h, w], (sample - shift_factor) * scaling_factor. A tensor "
        "with the VAE's latent channels is taken as latents already; with given `latents` nothing is encoded."
    )

    expected_components = [ComponentSpec("vae", "diffusers.AutoencoderKL"), IMAGE_PROCESSOR]

    inputs = [
        InputParam.template("image", required=True),
        InputParam.template("height"),
        InputParam.template("width"),
        LATENTS,
        *BATCH_INPUTS,
        DTYPE,
    ]

    intermediate_outputs = [
        tensor_output("image_latents", "VAE latents of the image, not packed; None when latents are given.")
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        image = image_processor_for_vae(components).preprocess(block_state.image, height=height, width=width)
        total = block_state.batch_size * block_state.num_images_per_prompt
        check_generators(self, block_state.generator, total)
        image_latents = None
        if block_state.latents is None:
            vae = components.vae
            dtype = block_state.dtype or vae.dtype
            image = image.to(dtype=torch.float32).to(device=components._execution_device, dtype=dtype)
            if image.shape[1] == vae.config.latent_channels:
                image_latents = image
            else:
                # One generator per given image (not per output image), as the classic pipeline draws them.
                image_latents = encode_shifted_latents(vae, image, block_state.generator)
        block_state.image_latents = image_latents
        self.set_block_state(state, block_state)
        return components, state


class FluxControlImageEncoderStep(ModularPipelineBlocks):
    """Control: preprocess the control image, repeat it to the batch, encode and pack it."""

    model_name = MODEL_NAME

    description = (
        "Preprocesses `control_image` to height x width (a tensor is taken as preprocessed), repeats it to "
        "the batch, encodes it with the VAE ((sample - shift_factor) * scaling_factor) and packs it into "
        "control_latents [B, tokens, C * 4], read beside the latents by a control transformer. A 3-dim "
        "tensor is taken as packed latents already. It runs before the initial noise is drawn, so the "
        "generator's draws keep the classic order."
    )

    expected_components = [ComponentSpec("vae", "diffusers.AutoencoderKL"), IMAGE_PROCESSOR]

    inputs = [
        CONTROL_IMAGE,
        InputParam.template("height"),
        InputParam.template("width"),
        *BATCH_INPUTS,
    ]

    intermediate_outputs = [
        tensor_output("control_latents", "Packed VAE latents of the control image, [B, tokens, C * 4].")
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        height, width = default_size(components, block_state.height, block_state.width)
        count = block_state.num_images_per_prompt
        total = block_state.batch_size * count
        check_generators(self, block_state.generator, total)
        image = block_state.control_image
        if not isinstance(image, torch.Tensor):
            image = image_processor_for_vae(components).preprocess(image, height=height, width=width)
        # One control image serves every output image; one per prompt is repeated per image of that prompt.
        image = image.repeat_interleave(total if image.shape[0] == 1 else count, dim=0)
        vae = components.vae
        image = image.to(device=components._execution_device, dtype=vae.dtype)
        if image.ndim == 4:
            # The generator (or list of them) samples the whole batch at once, as the classic pipeline does.
            latents = retrieve_latents(vae.encode(image), generator=block_state.generator)
            image = pack_latents(shift_and_scale(vae, latents))
        if image.shape[0] != total:
            msg = (
                f"{type(self).__name__}: {image.shape[0]} control images for a batch of {total} "
                "(prompts x num_images_per_prompt); pass 1 control image or one per prompt"
            )
            raise ValueError(msg)
        block_state.control_latents = image
        self.set_block_state(state, block_state)
        return components, state
