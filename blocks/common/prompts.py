"""What every family's text encoder step does with the prompt before encoding it."""

from __future__ import annotations

from typing import Any

__all__ = ["as_list", "check_prompt_or_embeds"]


def as_list(text: str | list[str], count: int = 1) -> list[str]:
    """A prompt as a list: a string repeated `count` times, a list as it is."""
    return [text] * count if isinstance(text, str) else list(text)


def check_prompt_or_embeds(block: object, prompt: Any, prompt_embeds: Any) -> None:
    """Exactly one of ``prompt`` and ``prompt_embeds`` must be given."""
    if (prompt is None) == (prompt_embeds is None):
        got = "both" if prompt is not None else "neither"
        msg = f"{type(block).__name__}: pass exactly one of prompt and prompt_embeds (got {got})"
        raise ValueError(msg)
