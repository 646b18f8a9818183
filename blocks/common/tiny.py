"""What the families' tiny-repo builders share: the CLIP and T5 tokenizers and text models, the VAE, variant files.

Each family's ``tiny.py`` writes a real diffusers-layout folder of tiny random models; the pieces
here are the ones two or more families build the same way, so that their tiny repos stay alike.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from .bpe import bytes_to_unicode

__all__ = [
    "TINY_WORDS",
    "VARIANT_DTYPES",
    "make_tiny_clip_tokenizer",
    "make_tiny_t5_tokenizer",
    "tiny_clip_config",
    "tiny_t5",
    "tiny_vae",
    "write_bpe_files",
    "write_variant_weights",
]

# Special tokens sit at fixed ids so that the text model's config can name them.
_BOS, _EOS = "<|startoftext|>", "<|endoftext|>"
_BOS_ID, _EOS_ID = 0, 1
# A few words get merged tokens so that prompts tokenize into whole words, as with a real vocab.
TINY_WORDS = (
    "a",
    "photo",
    "of",
    "cat",
    "dog",
    "the",
    "astronaut",
    "riding",
    "horse",
    "red",
    "blue",
    "blurry",
)

_T5_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789,.!?'-"

VARIANT_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""The dtype of a weights variant's files; float32 for any other variant name."""


def _clip_vocab_and_merges() -> tuple[dict[str, int], list[str]]:
    """A ~600-token CLIP-style vocabulary: specials, every byte alone and word-final, and word merges."""
    vocab: dict[str, int] = {_BOS: _BOS_ID, _EOS: _EOS_ID}
    for char in bytes_to_unicode():
        vocab.setdefault(char, len(vocab))
    for char in bytes_to_unicode():
        vocab.setdefault(char + "</w>", len(vocab))
    merges: list[str] = []
    for word in TINY_WORDS:
        # Merge left to right: ((w o) r) d</w>; each merge's result becomes a token.
        symbols = list(word[:-1]) + [word[-1] + "</w>"]
        current = symbols[0]
        for nxt in symbols[1:]:
            merge = f"{current} {nxt}"
            current = current + nxt
            if merge not in merges:
                merges.append(merge)
            vocab.setdefault(current, len(vocab))
    return vocab, merges


def write_bpe_files(folder: str | Path) -> None:
    """Write the tiny CLIP tokenizer's plain BPE files, ``vocab.json`` and ``merges.txt``, into `folder`.

    Real CLIP tokenizer folders carry them beside ``tokenizer.json``; ``save_pretrained`` does not
    write them, so the builders add them for tools that read them.
    """
    folder = Path(folder)
    vocab, merges = _clip_vocab_and_merges()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")


def make_tiny_clip_tokenizer(folder: str | Path):
    """Write ``vocab.json`` and ``merges.txt`` into `folder`, build a CLIPTokenizer from them, save it there.

    Args:
        folder: where the tokenizer files go (created if missing).

    Returns:
        The ``transformers.CLIPTokenizer`` read back from the files.
    """
    from transformers import CLIPTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as raw:
        raw_dir = Path(raw)
        write_bpe_files(raw_dir)
        tokenizer = CLIPTokenizer(
            vocab=str(raw_dir / "vocab.json"), merges=str(raw_dir / "merges.txt"), model_max_length=77
        )
    tokenizer.save_pretrained(folder)
    # Keep the plain BPE files beside tokenizer.json, as real SD repos do.
    write_bpe_files(folder)
    return CLIPTokenizer.from_pretrained(folder)


def make_tiny_t5_tokenizer(folder: str | Path):
    """Write a small Unigram T5 tokenizer (whole words, single characters, specials) into `folder`.

    Args:
        folder: where ``tokenizer.json`` and ``tokenizer_config.json`` go (created if missing).

    Returns:
        The ``transformers.T5Tokenizer`` (tokenizers-backed, the fast one) read back from the files.
    """
    from transformers import T5Tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # Ids 0-2 are pad, eos and unk as in T5; whole words score above single characters.
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    # The T5 tokenizer knows the CLIP one's whole words.
    vocab += [(f"\u2581{word}", -1.0 - index / 100) for index, word in enumerate(TINY_WORDS)]
    vocab += [("\u2581", -5.0)] + [(char, -8.0) for char in _T5_CHARS]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=512)
    tokenizer.save_pretrained(folder)
    return T5Tokenizer.from_pretrained(folder)


def tiny_t5(d_model: int, d_kv: int, d_ff: int, num_layers: int, num_heads: int):
    """A T5 encoder over the tiny T5 tokenizer's 64 ids."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(
            vocab_size=64,
            d_model=d_model,
            d_kv=d_kv,
            d_ff=d_ff,
            num_layers=num_layers,
            num_heads=num_heads,
            relative_attention_num_buckets=8,
            pad_token_id=0,
            eos_token_id=1,
        )
    )


def tiny_clip_config(**overrides: Any):
    """The config of the tiny CLIP text model the families use (5 layers of width 32), with `overrides`."""
    from transformers import CLIPTextConfig

    settings: dict[str, Any] = {
        "bos_token_id": _BOS_ID,
        "eos_token_id": _EOS_ID,
        "pad_token_id": _EOS_ID,
        "hidden_size": 32,
        "intermediate_size": 37,
        "layer_norm_eps": 1e-05,
        "num_attention_heads": 4,
        "num_hidden_layers": 5,
        "vocab_size": 1000,
        "projection_dim": 32,
    }
    return CLIPTextConfig(**{**settings, **overrides})


def tiny_vae(block_out_channels: tuple[int, ...], **config: Any):
    """An RGB AutoencoderKL with one down and one up block per entry of `block_out_channels`.

    Its scale factor is ``2 ** (len(block_out_channels) - 1)`` pixels per latent cell; `config` gives the
    rest (latent channels, sample size, scaling and shift factors ...).
    """
    from diffusers import AutoencoderKL

    levels = len(block_out_channels)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        block_out_channels=block_out_channels,
        **config,
    )


def write_variant_weights(
    folder: str | Path, models: Mapping[str, Any], names: Iterable[str], variant: str
) -> None:
    """Write the named models' weights as ``*.<variant>.safetensors`` into their subfolders of `folder`.

    The files hold the weights in the variant's dtype (``VARIANT_DTYPES``; float32 for other names),
    beside the plain ones, as hub repos do; the configs stay the plain ones. A name whose model is None
    is skipped. The models are cast to that dtype in place.
    """
    dtype = VARIANT_DTYPES.get(variant, torch.float32)
    for name in names:
        model = models[name]
        if model is None:
            continue
        # Save to a scratch folder and keep only the weights: the config stays the plain one.
        with tempfile.TemporaryDirectory() as scratch:
            model.to(dtype).save_pretrained(scratch, safe_serialization=True, variant=variant)
            for weights in Path(scratch).glob(f"*.{variant}.safetensors"):
                shutil.copyfile(weights, Path(folder) / name / weights.name)
