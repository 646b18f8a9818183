"""Tiny classic repos for the peer's Qwen-Image and Wan pipelines, written offline.

The model sizes are those of diffusers' own tests for these families (``tests/lora/test_lora_layers_qwenimage.py``
and ``test_lora_layers_wan.py``); the text encoders, which those tests download, are built here from small
configs, and the tokenizers from a byte-level BPE (Qwen) and the Flux builder's Unigram T5 tokenizer (Wan).
Each builder assembles the classic diffusers pipeline and saves it with its own ``save_pretrained``, so the
folder is what the peer's ``init_pipeline(folder)`` reads from a real repo.
"""

from __future__ import annotations

from pathlib import Path

import torch

from blocks.common.bpe import bytes_to_unicode
from blocks.flux.tiny import make_tiny_t5_tokenizer

__all__ = ["make_tiny_qwen_image_repo", "make_tiny_wan_repo"]

# Qwen-Image's prompt template uses these; they sit after the 256 byte tokens.
_QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>")


def _qwen_tokenizer():
    from transformers import Qwen2Tokenizer

    vocab = {char: index for index, char in enumerate(bytes_to_unicode())}
    for token in _QWEN_SPECIALS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": list(_QWEN_SPECIALS[1:])})
    return tokenizer, len(vocab)


def _qwen_text_encoder(vocab_size: int, hidden: int):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = {
        "hidden_size": hidden,
        "intermediate_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": vocab_size,
        "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
        "rope_theta": 1000000.0,
        "bos_token_id": vocab_size - len(_QWEN_SPECIALS),  # <|endoftext|>
        "eos_token_id": vocab_size - len(_QWEN_SPECIALS),
    }
    vision = {
        "depth": 2,
        "hidden_size": hidden,
        "intermediate_size": hidden,
        "num_heads": 2,
        "out_hidden_size": hidden,
    }
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        vocab_size=vocab_size,
        hidden_size=hidden,
        image_token_id=vocab_size - 1,
        video_token_id=vocab_size - 1,
        vision_start_token_id=vocab_size - 2,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def make_tiny_qwen_image_repo(folder: str | Path, seed: int = 0) -> Path:
    """Write a tiny Qwen-Image repo (transformer, VAE, Qwen2.5-VL text encoder, tokenizer, scheduler)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=24,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    )
    tokenizer, vocab_size = _qwen_tokenizer()
    pipe = QwenImagePipeline(
        transformer=transformer,
        vae=vae,
        text_encoder=_qwen_text_encoder(vocab_size, hidden=16),
        tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    pipe.save_pretrained(folder)
    return Path(folder)


def make_tiny_wan_repo(folder: str | Path, seed: int = 0) -> Path:
    """Write a tiny Wan 2.1 text-to-video repo (transformer, VAE, UMT5 text encoder, T5 tokenizer, scheduler)."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    folder = Path(folder)
    tokenizer = make_tiny_t5_tokenizer(folder / "tokenizer")
    text_config = UMT5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
    )
    pipe = WanPipeline(
        transformer=transformer,
        vae=vae,
        text_encoder=UMT5EncoderModel(text_config).eval(),
        tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    pipe.save_pretrained(folder)
    return folder
