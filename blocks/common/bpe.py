"""Byte-level BPE helpers shared by the tiny tokenizers the families build offline."""

from __future__ import annotations

__all__ = ["bytes_to_unicode"]


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
