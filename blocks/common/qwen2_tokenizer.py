"""A tiny byte-level Qwen2 tokenizer, built offline, for the families whose text encoder is a Qwen model.

Specials first, then every byte, then merged tokens for a few whole words (alone and after a space), so
prompts tokenize into words as with a real vocabulary while the file stays a few hundred tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bpe import byte_level_vocab

__all__ = ["make_tiny_qwen2_tokenizer", "make_trained_qwen2_tokenizer"]


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
    vocab, merges = byte_level_vocab(tuple(specials), tuple(words))
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


def make_trained_qwen2_tokenizer(
    folder: str | Path,
    specials: Sequence[str],
    corpus: Sequence[str],
    *,
    vocab_size: int = 600,
    model_max_length: int = 512,
):
    """A Qwen2Tokenizer whose byte-level BPE merges are learned from `corpus` (with the tokenizers library's
    trainer, offline), saved into `folder` and read back.

    Unlike ``make_tiny_qwen2_tokenizer``'s merges per word, learned merges never compete: every word of the
    corpus that the vocabulary has room for becomes one token, so a pipeline's system prompt tokenizes into
    words as with the real vocabulary.

    Args:
        folder: where the tokenizer files go (created if missing).
        specials: the special tokens, the first being ``<|endoftext|>`` (ids 0, 1, ... in this order).
        corpus: texts to learn the merges from.
        vocab_size: at most this many tokens (specials, the 256 bytes, and merges).
        model_max_length: the tokenizer's maximum length.

    Returns:
        The ``transformers.Qwen2Tokenizer`` read back from `folder`.
    """
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    learner.train_from_iterator(list(corpus), trainer)
    merges: Any = [tuple(pair) for pair in json.loads(learner.to_str())["model"]["merges"]]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Qwen2Tokenizer(
        vocab=learner.get_vocab(),
        merges=merges,
        additional_special_tokens=list(specials[1:]),
        model_max_length=model_max_length,
    )
    tokenizer.save_pretrained(folder)
    return Qwen2Tokenizer.from_pretrained(folder)
