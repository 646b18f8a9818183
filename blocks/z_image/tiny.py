"""Tiny Z-Image repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json`` naming
``ZImagePipeline``, one subfolder per component, safetensors weights, a Qwen2 tokenizer with a chat
template) of tiny random models, saved with the libraries' own ``save_pretrained``, so that loading
it runs the same code as loading a real repo. The sizes follow diffusers' own Z-Image fast tests: a
2-layer ZImageTransformer2DModel of width 32, a 2-layer Qwen3 text model of width 16 and a 2-level
16-channel VAE, so a 32x32 image takes a fraction of a second.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from blocks.common.qwen2_tokenizer import make_tiny_qwen2_tokenizer
from blocks.common.tiny import tiny_vae, write_variant_weights

__all__ = ["make_tiny_repo", "make_tiny_tokenizer", "CHAT_TEMPLATE"]

_PAD = "<|endoftext|>"
_SPECIALS = (_PAD, "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# Words that get merged tokens, so prompts tokenize into whole words as with a real vocab.
_WORDS = ("user", "assistant", "a", "photo", "of", "cat", "dog", "the", "red", "blue", "blurry", "astronaut")
_VOCAB_SIZE = 1024  # the text model's embedding rows; the tokenizer uses fewer ids

# A Qwen3-style chat template, reduced to what the pipeline asks for: user/assistant turns, the
# generation prompt, and the empty think block Qwen3 adds when thinking is switched off.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Z-Image-Turbo's scheduler: flow matching with a fixed shift of 3.
_SCHEDULER_CONFIG = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}


def make_tiny_tokenizer(folder: str | Path):
    """Build a Qwen2Tokenizer from a small vocabulary and merges, with a chat template, and save it.

    Args:
        folder: where the tokenizer files go (created if missing).

    Returns:
        The ``transformers.Qwen2Tokenizer`` read back from `folder`.
    """
    return make_tiny_qwen2_tokenizer(folder, _SPECIALS, _WORDS, chat_template=CHAT_TEMPLATE)


def _tiny_models(seed: int) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=16,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[8, 4, 4],
        axes_lens=[256, 32, 32],
    )
    # The pad tokens start as torch.empty; give them fixed values so the weights are deterministic.
    with torch.no_grad():
        transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token))
        transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token))
    torch.manual_seed(seed + 1)
    vae = tiny_vae(
        (32, 64),
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=32,
        sample_size=32,
        scaling_factor=0.3611,
        shift_factor=0.1159,
    )
    torch.manual_seed(seed + 2)
    text_config = Qwen3Config(
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=_VOCAB_SIZE,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=2,
    )
    text_encoder = Qwen3Model(text_config).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**_SCHEDULER_CONFIG)
    return {
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "text_encoder": text_encoder,
        "scheduler": scheduler,
    }


def make_tiny_repo(folder: str | Path, variant: str | None = None, *, seed: int = 0) -> Path:
    """Write a tiny random Z-Image repo in the diffusers layout.

    The folder gets ``model_index.json`` (``ZImagePipeline``) and ``transformer/``, ``vae/``,
    ``text_encoder/`` (a ``Qwen3Model``), ``tokenizer/`` (a ``Qwen2Tokenizer`` with a chat template)
    and ``scheduler/`` (``FlowMatchEulerDiscreteScheduler`` with shift 3). Weights are float32
    safetensors. With a `variant`, variant weight files are written beside the plain ones, holding
    the weights in the variant's dtype (float16 for ``"fp16"``, bfloat16 for ``"bf16"``, float32
    otherwise), as hub repos do. The same arguments always write the same weights.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"bf16"``.
        seed: the seed of the random weights.

    Returns:
        The repo folder as a Path.
    """
    from diffusers import ZImagePipeline

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = _tiny_models(seed)
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = make_tiny_tokenizer(tok_dir)
    ZImagePipeline(**models, tokenizer=tokenizer).save_pretrained(folder, safe_serialization=True)
    if variant is not None:
        write_variant_weights(folder, models, ("transformer", "vae", "text_encoder"), variant)
    return folder
