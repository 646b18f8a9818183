"""What every family's text encoder step does with the prompt before encoding it."""

from __future__ import annotations

from typing import Any

__all__ = ["as_list", "check_prompt_or_embeds", "negative_texts"]


def as_list(text: str | list[str], count: int = 1) -> list[str]:
    """A prompt as a list: a string repeated `count` times, a list as it is."""
    return [text] * count if isinstance(text, str) else list(text)


def check_prompt_or_embeds(block: object, prompt: Any, prompt_embeds: Any) -> None:
    """Exactly one of ``prompt`` and ``prompt_embeds`` must be given."""
    if (prompt is None) == (prompt_embeds is None):
        got = "both" if prompt is not None else "neither"
        msg = f"{type(block).__name__}: pass exactly one of prompt and prompt_embeds (got {got})"
        raise ValueError(msg)


def negative_texts(
    block: object, negative: str | list[str], count: int, name: str = "negative_prompt"
) -> list[str]:
    """``negative`` as one text per prompt: a string repeated ``count`` times, a list of ``count`` as it is.

    Raises:
        ValueError: a list of another length (the message names ``name`` and the block).
    """
    texts = as_list(negative, count)
    if len(texts) != count:
        msg = (
            f"{type(block).__name__}: {name} needs one entry per prompt (got {len(texts)} for {count} prompts); "
            f"pass a string or a list of {count}"
        )
        raise ValueError(msg)
    return texts
