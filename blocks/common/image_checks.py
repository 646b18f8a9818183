"""Rules for a call's image inputs (reference images, masks), applied by the check-inputs steps.

Part of ``blocks.common.checks``, which re-exports every name here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import PIL.Image
import torch

if TYPE_CHECKING:  # the rules only call problems.add; checks.py imports this module
    from .checks import InputProblems

__all__ = [
    "ImageInfo",
    "check_image",
    "check_image_count",
    "check_mask",
    "check_reference_image",
    "image_info",
    "vae_channels",
]


class ImageInfo(NamedTuple):
    """What the image processor will see: image count, channels (None: not an image layout), pixel size."""

    images: int
    channels: int | None
    height: int | None
    width: int | None
    kind: str  # "a PIL image in mode 'RGBA'", "a tensor of shape (1, 1, 32, 32)" ...


def image_info(image: Any) -> ImageInfo:
    """Count, channels and size of an image input (PIL, numpy [H, W, C] or tensor [C, H, W], or batches)."""
    items = image if isinstance(image, list) else [image]
    if not items:
        return ImageInfo(0, None, None, None, "an empty list")
    first = items[0]
    if isinstance(first, PIL.Image.Image):
        kind = f"a PIL image in mode {first.mode!r}"
        return ImageInfo(len(items), len(first.getbands()), first.height, first.width, kind)
    if isinstance(first, np.ndarray):
        # numpy images are channels-last ([H, W, C]); a 2-dim one is grayscale.
        return _array_info(items, tuple(first.shape), f"an array of shape {tuple(first.shape)}", last=True)
    if isinstance(first, torch.Tensor):
        return _array_info(items, tuple(first.shape), f"a tensor of shape {tuple(first.shape)}", last=False)
    return ImageInfo(len(items), None, None, None, f"a {type(first).__name__}")


def _array_info(items: list[Any], shape: tuple[int, ...], kind: str, *, last: bool) -> ImageInfo:
    """ImageInfo of arrays or tensors shaped like the first, `shape`: one image, or a batch of them in front.

    Args:
        last: channels come last ([H, W, C], numpy's layout), else first ([C, H, W], torch's).
    """
    count = sum(len(i) for i in items) if len(shape) == 4 else len(items)
    image = shape[1:] if len(shape) == 4 else shape
    if len(image) == 2 and last:
        return ImageInfo(count, 1, image[0], image[1], kind)
    if len(image) != 3:
        return ImageInfo(count, None, None, None, kind)
    channels, height, width = (image[2], image[0], image[1]) if last else image
    return ImageInfo(count, channels, height, width, kind)


def check_image(
    problems: InputProblems, name: str, info: ImageInfo, rgb: int, latent_channels: int | None
) -> None:
    """An image must have the `rgb` channels the VAE encodes (a tensor or array may instead hold latents).

    Args:
        rgb: the VAE's input channels (3).
        latent_channels: channels of an image taken as latents already, or None if the step takes none.
    """
    if info.images == 0:
        problems.add(f"{name} is an empty list; pass an image or a list of at least one")
        return
    if info.channels is None:
        layout = "[H, W, C] or [B, H, W, C]" if "array" in info.kind else "[C, H, W] or [B, C, H, W]"
        problems.add(f"{name} ({info.kind}) is not an image; pass a PIL image, or a {layout} tensor or array")
        return
    if info.channels == rgb:
        return
    if info.kind.startswith("a PIL"):
        problems.add(
            f"{name} has {_channels_text(info.channels)} ({info.kind}), the VAE encodes {rgb}; "
            f"pass an RGB image, e.g. {name}.convert('RGB')"
        )
    elif info.channels != latent_channels:
        latents = f", or {latent_channels} for latents" if latent_channels else ""
        problems.add(f"{name} has {_channels_text(info.channels)} ({info.kind}); pass {rgb} (RGB){latents}")


def check_reference_image(
    problems: InputProblems, name: str, image: Any, rgb: int, latent_channels: int | None, total: int | None
) -> ImageInfo:
    """The image has `rgb` channels (or `latent_channels`) and, with a known batch, a count that divides it.

    Returns:
        What the image processor will see of it.
    """
    info = image_info(image)
    check_image(problems, name, info, rgb, latent_channels)
    if total is not None:
        check_image_count(problems, name, info.images, total)
    return info


def vae_channels(components: Any, default: tuple[int, int]) -> tuple[int, int]:
    """The VAE's (image channels, latent channels), or `default` when no VAE is loaded."""
    vae = getattr(components, "vae", None)
    if vae is None:
        return default
    return vae.config.in_channels, vae.config.latent_channels


def _channels_text(count: int) -> str:
    return "1 channel" if count == 1 else f"{count} channels"


def check_image_count(problems: InputProblems, name: str, count: int, total: int) -> None:
    """The images are repeated to the batch, so their count must divide it."""
    if count and total % count:
        problems.add(
            f"{name} holds {count} images for a batch of {total} (prompts x num_images_per_prompt); "
            f"pass a number of images that divides {total}, e.g. 1"
        )


def check_mask(problems: InputProblems, mask: Any, total: int) -> None:
    """A mask is single-channel ([B, 1, H, W] or [B, H, W] as a tensor), its count dividing the batch."""
    if isinstance(mask, torch.Tensor):
        if mask.ndim == 4 and mask.shape[1] != 1:
            problems.add(
                f"mask_image has {mask.shape[1]} channels (a tensor of shape {tuple(mask.shape)}); "
                "pass a single-channel mask, [B, 1, H, W]"
            )
            return
        count = mask.shape[0] if mask.ndim in (3, 4) else 1
    else:
        info = image_info(mask)
        if info.images == 0:
            problems.add("mask_image is an empty list; pass a mask or a list of at least one")
            return
        count = info.images
    check_image_count(problems, "mask_image", count, total)
