"""A tiny byte-level Qwen2 tokenizer, built offline, for the families whose text encoder is a Qwen model.

Specials first, then every byte, then merged tokens for a few whole words (alone and after a space), so
prompts tokenize into words as with a real vocabulary while the file stays a few hundred tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bpe import bytes_to_unicode

__all__ = ["make_tiny_qwen2_tokenizer", "qwen2_vocab_and_merges"]


def qwen2_vocab_and_merges(specials: Sequence[str], words: Sequence[str]) -> tuple[dict[str, int], list[str]]:
    """A byte-level vocabulary: `specials` (ids 0, 1, ...), every byte, and merges for each of `words`."""
    vocab: dict[str, int] = {token: index for index, token in enumerate(specials)}
    for char in bytes_to_unicode():
        vocab.setdefault(char, len(vocab))
    merges: list[str] = []
    space = bytes_to_unicode()[ord(" ")]  # "Ġ": a word after a space starts with it
    for word in words:
        # Merge left to right: ((c a) t); each merge's result becomes a token. Then the word after a
        # space: "Ġ" + "cat" (merging the word first keeps the space from splitting it).
        current = word[0]
        for nxt in [*word[1:], None]:
            merge = f"{space} {word}" if nxt is None else f"{current} {nxt}"
            current = space + word if nxt is None else current + nxt
            if merge not in merges:
                merges.append(merge)
            vocab.setdefault(current, len(vocab))
    return vocab, merges


def make_tiny_qwen2_tokenizer(
    folder: str | Path,
    specials: Sequence[str],
    words: Sequence[str],
    *,
    chat_template: str | None = None,
    model_max_length: int = 512,
):
    """Build a Qwen2Tokenizer (pad and end token: ``specials[0]``), save it into `folder`, read it back.

    Args:
        folder: where the tokenizer files go (created if missing).
        specials: the special tokens, the first being ``<|endoftext|>``; the others become additional
            special tokens.
        words: words that get merged tokens.
        chat_template: an optional Jinja chat template.
        model_max_length: the tokenizer's maximum length.

    Returns:
        The ``transformers.Qwen2Tokenizer`` read back from `folder`.
    """
    from transformers import Qwen2Tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = qwen2_vocab_and_merges(specials, words)
    # The BPE model takes merges as pairs (transformers' annotation says strings).
    pairs: Any = [tuple(merge.split(" ")) for merge in merges]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=pairs,
        additional_special_tokens=list(specials[1:]),
        model_max_length=model_max_length,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    return Qwen2Tokenizer.from_pretrained(folder)
