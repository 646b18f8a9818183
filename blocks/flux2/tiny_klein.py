"""Tiny Flux.2 Klein repos for tests, written offline.

`make_tiny_klein_repo` writes a diffusers-layout folder (``model_index.json`` naming ``Flux2KleinPipeline``)
of tiny random models: the Flux.2 tiny repo's VAE and scheduler, a transformer without a guidance embedding
(Klein is guided by true classifier-free guidance, or step-distilled), and a 27-layer Qwen3ForCausalLM of
width 16 with a Qwen2 tokenizer (so the classic default ``text_encoder_out_layers``, 9, 18 and 27, read real
layers).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from blocks.common.qwen2_tokenizer import QWEN3_CHAT_TEMPLATE, QWEN3_SPECIALS, make_tiny_qwen2_tokenizer
from blocks.common.tiny import write_variant_weights

from .tiny import LATENT_CHANNELS, SCHEDULER_CONFIG, tiny_flux2_vae

__all__ = ["KLEIN_TEXT_LAYERS", "make_tiny_klein_repo"]

KLEIN_TEXT_LAYERS = 27
_TEXT_WIDTH = 16
_WORDS = ("user", "assistant", "photo", "of", "cat", "dog", "the", "red", "blue", "blurry", "astronaut")


def _text_encoder():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        hidden_size=_TEXT_WIDTH,
        intermediate_size=24,
        num_hidden_layers=KLEIN_TEXT_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=512,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=2,
    )
    return Qwen3ForCausalLM(config).eval()


def make_tiny_klein_repo(
    folder: str | Path, variant: str | None = None, *, seed: int = 0, is_distilled: bool = False
) -> Path:
    """Write a tiny random Flux.2 Klein repo in the diffusers layout.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"bf16"`` (files beside the plain ones).
        seed: the seed of the random weights.
        is_distilled: the pipeline config's ``is_distilled`` (a step-distilled Klein: no classifier-free
            guidance).

    Returns:
        The repo folder as a Path.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=LATENT_CHANNELS * 4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=_TEXT_WIDTH * 3,
        timestep_guidance_channels=256,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False,
    ).eval()
    models = {"transformer": transformer, "vae": tiny_flux2_vae(seed + 1)}
    torch.manual_seed(seed + 2)
    models["text_encoder"] = _text_encoder()
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = make_tiny_qwen2_tokenizer(
            tok_dir, QWEN3_SPECIALS, _WORDS, chat_template=QWEN3_CHAT_TEMPLATE
        )
    Flux2KleinPipeline(
        **models,
        tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        is_distilled=is_distilled,
    ).save_pretrained(folder, safe_serialization=True)
    if variant is not None:
        write_variant_weights(folder, models, tuple(models), variant)
    return folder
