"""The batch a call makes (prompts x num_images_per_prompt) and what is repeated or checked to fill it."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_generators", "repeat_images", "repeat_per_image"]


def check_generators(block: object, generator: Any, total: int) -> None:
    """A list of generators must hold one per image of the batch."""
    if isinstance(generator, list) and len(generator) != total:
        msg = (
            f"{type(block).__name__}: a list of generators needs one per image (got {len(generator)} for a batch "
            f"of {total} = prompts x num_images_per_prompt); pass one generator or {total}"
        )
        raise ValueError(msg)


def repeat_images(block: object, images: torch.Tensor, total: int) -> torch.Tensor:
    """`images` (or their latents) repeated along dim 0 up to the batch of `total`, which their count must divide.

    torch.cat, not Tensor.repeat: cat keeps the VAE output's memory layout (channels-last on CPU), and
    a UNet's convolutions round differently per layout; the classic pipelines use cat.
    """
    count = images.shape[0]
    if total % count != 0:
        msg = (
            f"{type(block).__name__}: {count} images cannot be repeated to a batch of {total} "
            f"(prompts x num_images_per_prompt); pass 1 image or {total}"
        )
        raise ValueError(msg)
    if count == total:
        return images
    return torch.cat([images] * (total // count))


def repeat_per_image(embeds: torch.Tensor, count: int) -> torch.Tensor:
    """[p0, p1] -> [p0, p0, p1, p1] along dim 0 (count times each): the images of one prompt stay together."""
    batch = embeds.shape[0]
    repeated = embeds.repeat(1, count, *([1] * (embeds.dim() - 2)))
    return repeated.view(batch * count, *embeds.shape[1:])
