"""Flux (FLUX.1) as modular blocks."""

from .tiny import make_tiny_repo, make_tiny_t5_tokenizer

__all__ = ["make_tiny_repo", "make_tiny_t5_tokenizer"]
