"""A tiny Qwen2 tokenizer with a Qwen3-style chat template, written offline, for the families whose text
encoder is a Qwen3 model (Z-Image, Flux.2 Klein)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bpe import byte_level_vocab

__all__ = ["QWEN_CHAT_TEMPLATE", "QWEN_SPECIALS", "make_tiny_qwen_tokenizer"]

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
"""The pad token first, then the chat template's special tokens."""

# A Qwen3-style chat template, reduced to what the pipelines ask for: user/assistant turns, the
# generation prompt, and the empty think block Qwen3 adds when thinking is switched off.
QWEN_CHAT_TEMPLATE = (
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


def make_tiny_qwen_tokenizer(folder: str | Path, words: tuple[str, ...]):
    """Build a Qwen2Tokenizer from a small byte-level vocabulary (merged `words`), with the chat template, save it.

    Args:
        folder: where the tokenizer files go (created if missing).
        words: the words that become single tokens.

    Returns:
        The ``transformers.Qwen2Tokenizer`` read back from `folder`.
    """
    from transformers import Qwen2Tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = byte_level_vocab(QWEN_SPECIALS, words)
    # The BPE model takes merges as pairs (transformers' annotation says strings).
    pairs: Any = [tuple(merge.split(" ")) for merge in merges]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=pairs,
        additional_special_tokens=list(QWEN_SPECIALS[1:]),
        model_max_length=512,
    )
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return Qwen2Tokenizer.from_pretrained(folder)
