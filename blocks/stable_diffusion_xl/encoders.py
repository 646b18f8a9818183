"""Encoder steps: the two CLIP prompt encoders (and the refiner's one), and VAE encoding for image-to-image."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

from blocks.stable_diffusion.encoders import IMAGE_PROCESSOR
from blocks.stable_diffusion.utils import image_processor_for_vae
from modular import ComponentSpec, ConfigSpec, InputParam, ModularPipelineBlocks, OutputParam

from .utils import MODEL_NAME, batch_input, dtype_input, encode_image_latents, guidance_scale_input

__all__ = [
    "PROMPT_2",
    "NEGATIVE_PROMPT_2",
    "StableDiffusionXLTextEncoderStep",
    "StableDiffusionXLRefinerTextEncoderStep",
    "StableDiffusionXLVaeEncoderStep",
]

PROMPT_2 = InputParam(
    "prompt_2", type_hint=str | list[str], description="The prompt for the second encoder (default: prompt)."
)
NEGATIVE_PROMPT_2 = InputParam(
    "negative_prompt_2",
    type_hint=str | list[str],
    description="The negative prompt for the second encoder (default: negative_prompt).",
)
_POOLED = "pooled_prompt_embeds"
_NEG_POOLED = "negative_pooled_prompt_embeds"


def _as_list(text: str | list[str], batch_size: int) -> list[str]:
    return [text] * batch_size if isinstance(text, str) else list(text)


class StableDiffusionXLTextEncoderStep(ModularPipelineBlocks):
    """Encode the prompt with both CLIP text encoders into SDXL's hidden states and pooled embedding."""

    model_name = MODEL_NAME
    # (tokenizer, text encoder) component names, in the order their hidden states are concatenated.
    encoder_names: tuple[tuple[str, str], ...] = (
        ("tokenizer", "text_encoder"),
        ("tokenizer_2", "text_encoder_2"),
    )

    @property
    def description(self) -> str:
        return (
            "Encodes prompt (first encoder) and prompt_2 (second encoder, default: prompt) into prompt_embeds, "
            "the penultimate hidden states of both encoders concatenated, and pooled_prompt_embeds, the second "
            "encoder's projected embedding. With guidance_scale > 1 the negative prompt is encoded the same way, "
            "or, when no negative prompt is given and force_zeros_for_empty_prompt is set, replaced by zeros."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        specs = []
        for tokenizer, encoder in self.encoder_names:
            hint = CLIPTextModelWithProjection if encoder == "text_encoder_2" else CLIPTextModel
            specs += [ComponentSpec(encoder, hint), ComponentSpec(tokenizer, CLIPTokenizer)]
        return specs

    @property
    def expected_configs(self) -> list[ConfigSpec]:
        return [
            ConfigSpec(
                "force_zeros_for_empty_prompt",
                True,
                "Without a negative prompt, use zero embeddings as the unconditional ones.",
            )
        ]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("prompt"),
            PROMPT_2,
            InputParam.template("negative_prompt"),
            NEGATIVE_PROMPT_2,
            InputParam.template("prompt_embeds"),
            InputParam.template("negative_prompt_embeds"),
            InputParam(_POOLED, type_hint=torch.Tensor, description="Precomputed pooled prompt embeddings."),
            InputParam(
                _NEG_POOLED, type_hint=torch.Tensor, description="Precomputed pooled negative embeddings."
            ),
            guidance_scale_input(),
            InputParam("clip_skip", type_hint=int, description="Number of final CLIP layers to skip."),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam.template("prompt_embeds"),
            OutputParam.template("negative_prompt_embeds"),
            OutputParam(_POOLED, type_hint=torch.Tensor, description="Pooled text embeddings of the prompt."),
            OutputParam(
                _NEG_POOLED, type_hint=torch.Tensor, description="Pooled embeddings of the negative prompt."
            ),
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
        negative = _as_list(negative_prompt or "", batch_size)
        negative_2 = _as_list(negative_prompt_2 or negative_prompt or "", batch_size)
        for name, texts in (("negative_prompt", negative), ("negative_prompt_2", negative_2)):
            if len(texts) != batch_size:
                msg = (
                    f"{type(self).__name__}: {name} needs one entry per prompt "
                    f"(got {len(texts)} negative prompts for {batch_size} prompts)"
                )
                raise ValueError(msg)
        return [negative, negative_2][: len(self.encoder_names)]

    def _check(self, bs) -> None:
        if (bs.prompt is None) == (bs.prompt_embeds is None):
            got = "both" if bs.prompt is not None else "neither"
            msg = f"{type(self).__name__}: pass exactly one of prompt and prompt_embeds (got {got})"
            raise ValueError(msg)
        pairs = (("prompt_embeds", _POOLED), ("negative_prompt_embeds", _NEG_POOLED))
        for embeds, pooled in pairs:
            if getattr(bs, embeds) is not None and getattr(bs, pooled) is None:
                msg = f"{type(self).__name__}: with {embeds} pass {pooled} too (SDXL conditions on both)"
                raise ValueError(msg)

    @torch.no_grad()
    def __call__(self, components, state):
        bs = self.get_block_state(state)
        self._check(bs)
        prompt = bs.prompt
        batch_size = len(_as_list(prompt, 1)) if prompt is not None else bs.prompt_embeds.shape[0]
        prompt_embeds, pooled = bs.prompt_embeds, bs.pooled_prompt_embeds
        if prompt_embeds is None:
            texts = [_as_list(prompt, 1), _as_list(bs.prompt_2 or prompt, 1)][: len(self.encoder_names)]
            if len(texts[-1]) != batch_size:
                msg = (
                    f"{type(self).__name__}: prompt_2 needs one entry per prompt (got {len(texts[-1])} for "
                    f"{batch_size} prompts); pass a list of {batch_size} or leave it out to reuse prompt"
                )
                raise ValueError(msg)
            prompt_embeds, encoded_pooled = self._encode(components, texts, None, bs.clip_skip)
            pooled = encoded_pooled if pooled is None else pooled

        negative_embeds, negative_pooled = bs.negative_prompt_embeds, bs.negative_pooled_prompt_embeds
        if bs.guidance_scale > 1 and negative_embeds is None:
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
        if bs.guidance_scale > 1:
            bs.negative_prompt_embeds = negative_embeds.to(dtype=dtype, device=device)
            bs.negative_pooled_prompt_embeds = negative_pooled
        self.set_block_state(state, bs)
        return components, state


class StableDiffusionXLRefinerTextEncoderStep(StableDiffusionXLTextEncoderStep):
    """The refiner's prompt encoding: ``text_encoder_2`` alone gives the hidden states and the pooled embedding."""

    encoder_names = (("tokenizer_2", "text_encoder_2"),)

    @property
    def description(self) -> str:
        return (
            "Encodes prompt with text_encoder_2 alone (prompt_2 is unused, as in the classic pipeline), since an "
            "SDXL refiner repo has no "
            "first text encoder: prompt_embeds are its penultimate hidden states, pooled_prompt_embeds its "
            "projected embedding. Negatives as in StableDiffusionXLTextEncoderStep (refiner repos set "
            "force_zeros_for_empty_prompt to false)."
        )

    @property
    def expected_configs(self) -> list[ConfigSpec]:
        return [
            ConfigSpec(
                "force_zeros_for_empty_prompt",
                False,
                "Zero unconditional embeddings without a negative prompt.",
            )
        ]


class StableDiffusionXLVaeEncoderStep(ModularPipelineBlocks):
    """Image-to-image: preprocess the reference image and encode it to normalized VAE latents."""

    model_name = MODEL_NAME

    @property
    def description(self) -> str:
        return (
            "Preprocesses `image` to [-1, 1] and encodes it with the VAE (in float32 when vae.config.force_upcast) "
            "into image_latents scaled by scaling_factor. A 4-channel tensor image is taken as latents already. "
            "Skipped when `latents` are given, as the classic pipeline then starts from them."
        )

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("vae", AutoencoderKL), IMAGE_PROCESSOR]

    @property
    def inputs(self) -> list[InputParam]:
        return [
            InputParam.template("image", required=True),
            InputParam.template("latents"),
            InputParam.template("generator"),
            batch_input(),
            InputParam.template("num_images_per_prompt"),
            dtype_input(),
        ]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [
            OutputParam(
                "image_latents", type_hint=torch.Tensor, description="Scaled VAE latents of the image."
            )
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
                    if len(generator) != total:
                        msg = (
                            f"{type(self).__name__}: a list of generators needs one per image "
                            f"(got {len(generator)} for a batch of {total})"
                        )
                        raise ValueError(msg)
                    # One generator per output image: repeat the images to the batch, encode each with its own.
                    if image.shape[0] < total and total % image.shape[0] == 0:
                        image = torch.cat([image] * (total // image.shape[0]))
                bs.image_latents = encode_image_latents(components.vae, image, generator)
        self.set_block_state(state, bs)
        return components, state
