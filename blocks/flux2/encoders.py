"""Encoder steps: the prompt with the Mistral 3 text encoder (stacked hidden states of several layers), and
the reference images of editing with the VAE (packed as extra tokens)."""

from __future__ import annotations

from typing import Any

import attrs
import PIL.Image
import torch

from blocks.common.params import BATCH_SIZE, tensor_output
from blocks.common.prompts import as_list, check_prompt_or_embeds
from blocks.common.vae import vae_scale_factor
from modular import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import (
    IMAGE_PROCESSOR,
    MODEL_NAME,
    VAE,
    image_processor_for_vae,
    normalize_latents,
    pack_latents,
    patchify_latents,
    reference_image_ids,
)

__all__ = [
    "MAX_REFERENCE_AREA",
    "PROMPT_INPUTS",
    "REFERENCE_IMAGE",
    "TEXT_ENCODER_OUT_LAYERS",
    "Flux2TextEncoderStep",
    "Flux2VaeEncoderStep",
    "reference_images",
]

# A reference image above this many pixels is first resized to about this area, as the classic pipeline does.
MAX_REFERENCE_AREA = 1024 * 1024

TEXT_ENCODER_OUT_LAYERS = InputParam(
    "text_encoder_out_layers",
    type_hint=tuple,
    default=(10, 20, 30),
    description="The text encoder layers whose hidden states are stacked into the prompt embeddings.",
)
PROMPT_INPUTS = (
    InputParam.template("prompt"),
    InputParam.template("prompt_embeds", note="[B, seq_len, layers * dim]"),
    InputParam(
        "max_sequence_length",
        type_hint=int,
        default=512,
        description="Tokens per prompt, system message included (longer prompts are cut).",
    ),
    TEXT_ENCODER_OUT_LAYERS,
)
REFERENCE_IMAGE = InputParam(
    "image",
    type_hint=PIL.Image.Image | list[PIL.Image.Image],
    description=(
        "One reference image or a list of them (PIL images, at least 64 pixels a side) to edit or "
        "draw from; each is encoded and read by the transformer beside the latents."
    ),
)


def reference_images(image: Any) -> list[Any]:
    """The reference images as a list: one image becomes a list of one."""
    return list(image) if isinstance(image, list) else [image]


class Flux2TextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt with Mistral 3: the hidden states of several layers, side by side per token."""

    model_name = MODEL_NAME

    description = (
        "Puts each prompt in a chat (Flux.2's system message, then the prompt as the user turn), tokenizes it "
        "padded to max_sequence_length with the tokenizer's chat template, runs the text encoder and stacks the "
        "hidden states of text_encoder_out_layers (default 10, 20, 30) per token: prompt_embeds [B, seq_len, "
        "layers * dim]. Precomputed prompt_embeds are used as given."
    )

    expected_components = [
        ComponentSpec("text_encoder", "transformers.Mistral3ForConditionalGeneration"),
        # FLUX.2 repos ship a PixtralProcessor (which needs torchvision); a tokenizer with a chat template that
        # takes a system turn and list contents serves as well for text prompts (the tiny repo's). The two share
        # no base class, so the repo's index names the class.
        ComponentSpec(
            "tokenizer",
            description="The text encoder's processor or tokenizer, with a chat template (the repo names the class).",
        ),
    ]

    inputs = list(PROMPT_INPUTS)

    intermediate_outputs = [OutputParam.template("prompt_embeds", note="[B, seq_len, layers * dim]")]

    @staticmethod
    def encode(components: Any, prompts: list[str], max_length: int, layers: tuple[int, ...]) -> torch.Tensor:
        """The embeddings [len(prompts), max_length, len(layers) * dim] of `prompts`."""
        from diffusers.pipelines.flux2.pipeline_flux2 import format_input
        from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

        text_encoder, device = components.text_encoder, components._execution_device
        tokens = components.tokenizer.apply_chat_template(
            format_input(prompts=prompts, system_message=SYSTEM_MESSAGE),
            add_generation_prompt=False,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            padding="max_length",
            truncation=True,
            max_length=max_length,
        )
        output = text_encoder(
            input_ids=tokens["input_ids"].to(device),
            attention_mask=tokens["attention_mask"].to(device),
            output_hidden_states=True,
            use_cache=False,
        )
        stacked = torch.stack([output.hidden_states[k] for k in layers], dim=1)
        stacked = stacked.to(dtype=text_encoder.dtype, device=device)
        batch, count, length, dim = stacked.shape
        return stacked.permute(0, 2, 1, 3).reshape(batch, length, count * dim)

    def _check_layers(self, components: Any, layers: tuple[int, ...]) -> None:
        config = components.text_encoder.config
        count = getattr(config, "text_config", config).num_hidden_layers
        bad = [k for k in layers if not -count - 1 <= k <= count]
        if not layers or bad:
            msg = (
                f"{type(self).__name__}: text_encoder_out_layers ({tuple(layers)}) must name hidden states of "
                f"the text encoder, 0 (the embeddings) to {count}; pass layers in that range"
            )
            raise ValueError(msg)

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        check_prompt_or_embeds(self, block_state.prompt, block_state.prompt_embeds)
        if block_state.prompt_embeds is None:
            layers = tuple(block_state.text_encoder_out_layers)
            self._check_layers(components, layers)
            block_state.prompt_embeds = self.encode(
                components, as_list(block_state.prompt), block_state.max_sequence_length, layers
            )
        self.set_block_state(state, block_state)
        return components, state


class Flux2VaeEncoderStep(ModularPipelineBlocks):
    """Editing: encode each reference image with the VAE and pack them all into extra tokens."""

    model_name = MODEL_NAME

    description = (
        "Resizes each reference image above 1024 x 1024 pixels to about that area, crops it to a multiple of "
        "twice the VAE's scale and encodes it with the VAE (the latent mode, patchified and normalized by the "
        "VAE's batch norm); the tokens of all images, one after another, are repeated for the batch: "
        "image_latents [B, tokens, C * 4] and image_latent_ids [B, tokens, 4] (T = 10, 20, ... per image). "
        "height and width default to the first image's size."
    )

    expected_components = [VAE, IMAGE_PROCESSOR]

    inputs = [
        attrs.evolve(REFERENCE_IMAGE, required=True),
        InputParam.template("height"),
        InputParam.template("width"),
        BATCH_SIZE,
        InputParam.template("num_images_per_prompt"),
    ]

    intermediate_outputs = [
        tensor_output("image_latents", "Packed latents of the reference images, [B, tokens, C * 4]."),
        OutputParam(
            "image_latent_ids",
            type_hint=torch.Tensor,
            description="Position ids of the reference images' tokens, [B, tokens, 4].",
        ),
        OutputParam("height", type_hint=int, description="The image height in pixels."),
        OutputParam("width", type_hint=int, description="The image width in pixels."),
    ]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        processor = image_processor_for_vae(components)
        multiple = vae_scale_factor(components) * 2
        vae, device = components.vae, components._execution_device
        latents, sizes = [], []
        height, width = block_state.height, block_state.width
        for image in reference_images(block_state.image):
            if image.width * image.height > MAX_REFERENCE_AREA:
                image = processor._resize_to_target_area(image, MAX_REFERENCE_AREA)
            image_width, image_height = (
                image.width // multiple * multiple,
                image.height // multiple * multiple,
            )
            pixels = processor.preprocess(image, height=image_height, width=image_width, resize_mode="crop")
            encoded = vae.encode(pixels.to(device=device, dtype=vae.dtype)).latent_dist.mode()
            encoded = normalize_latents(vae, patchify_latents(encoded))
            latents.append(pack_latents(encoded).squeeze(0))
            sizes.append(tuple(encoded.shape[-2:]))
            height, width = height or image_height, width or image_width
        total = block_state.batch_size * block_state.num_images_per_prompt
        block_state.image_latents = torch.cat(latents, dim=0).unsqueeze(0).repeat(total, 1, 1).to(device)
        block_state.image_latent_ids = reference_image_ids(sizes).repeat(total, 1, 1).to(device)
        block_state.height, block_state.width = height, width
        self.set_block_state(state, block_state)
        return components, state
