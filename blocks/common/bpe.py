"""Byte-level BPE helpers shared by the tiny tokenizers the families build offline."""

from __future__ import annotations

__all__ = ["byte_level_vocab", "bytes_to_unicode"]


def bytes_to_unicode() -> list[str]:
    """The printable stand-ins byte-level BPE uses for the 256 byte values, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def byte_level_vocab(specials: tuple[str, ...], words: tuple[str, ...]) -> tuple[dict[str, int], list[str]]:
    """A small byte-level BPE vocabulary: `specials` first, every byte, and merges for `words`.

    Each word is merged left to right (``((c a) t)``), then the word after a space (``"Ġ" + "cat"``:
    merging the word first keeps the space from splitting it), so prompts tokenize into whole words as
    with a real vocabulary.

    Returns:
        The vocabulary (token -> id) and the merges (``"left right"``), in order.
    """
    vocab: dict[str, int] = {token: index for index, token in enumerate(specials)}
    for char in bytes_to_unicode():
        vocab.setdefault(char, len(vocab))
    merges: list[str] = []
    space = bytes_to_unicode()[ord(" ")]
    for word in words:
        current = word[0]
        for nxt in [*word[1:], None]:
            merge = f"{space} {word}" if nxt is None else f"{current} {nxt}"
            current = space + word if nxt is None else current + nxt
            if merge not in merges:
                merges.append(merge)
            vocab.setdefault(current, len(vocab))
    return vocab, merges
