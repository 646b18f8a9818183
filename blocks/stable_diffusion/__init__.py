"""Stable Diffusion 1.x/2.x as modular blocks: text-to-image, image-to-image and inpainting."""

from .tiny import make_tiny_repo, make_tiny_tokenizer

__all__ = ["make_tiny_repo", "make_tiny_tokenizer"]
