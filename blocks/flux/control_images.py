"""Control images computed with torch alone: a canny-like edge map and a depth-like map.

They stand in for the preprocessors that make the inputs of FLUX.1-Canny-dev and FLUX.1-Depth-dev
(a Canny edge detector, a depth estimation model) when no such model is at hand, as in the tiny
scenario: same shapes and value ranges, no extra model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F

__all__ = ["depth_like_map", "edge_map"]

_LUMA = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)


def _luminance(image: Any) -> torch.Tensor:
    """``[1, 1, H, W]`` luminance in [0, 1] of a PIL image or an ``[H, W, 3]`` array in [0, 1]."""
    if isinstance(image, PIL.Image.Image):
        array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    else:
        array = np.asarray(image, dtype=np.float32)
    if array.ndim != 3 or array.shape[-1] != 3:
        msg = f"a control image is made from an RGB image of shape [H, W, 3] (got shape {list(array.shape)})"
        raise ValueError(msg)
    rgb = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1).unsqueeze(0)
    return (rgb * _LUMA).sum(dim=1, keepdim=True)


def _to_image(gray: torch.Tensor) -> PIL.Image.Image:
    """A ``[1, 1, H, W]`` map in [0, 1] as an RGB PIL image (the channel repeated, as the models take it)."""
    pixels = (gray[0, 0].clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return PIL.Image.fromarray(np.stack([pixels] * 3, axis=-1), mode="RGB")


def edge_map(image: Any, keep: float = 0.2) -> PIL.Image.Image:
    """White edges on black, as a Canny detector draws them: the strongest Sobel gradients of the
    slightly blurred luminance.

    Args:
        image: A PIL image, or an ``[H, W, 3]`` float array in [0, 1] (a pipeline's ``"np"`` output).
        keep: The share of pixels drawn as edges (those with the strongest gradient).

    Returns:
        An RGB PIL image of the input's size.
    """
    gray = _luminance(image)
    blur = torch.tensor([1.0, 2.0, 1.0])
    blur = (blur[:, None] * blur[None, :] / 16).view(1, 1, 3, 3)
    gray = F.conv2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), blur)
    sobel_x = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]).view(1, 1, 3, 3)
    padded = F.pad(gray, (1, 1, 1, 1), mode="replicate")
    magnitude = torch.hypot(F.conv2d(padded, sobel_x), F.conv2d(padded, sobel_x.transpose(2, 3)))
    threshold = torch.quantile(magnitude.flatten(), 1.0 - keep)
    return _to_image((magnitude > threshold).float())


def depth_like_map(image: Any, blur: int = 9) -> PIL.Image.Image:
    """A depth-like map, near bright and far dark: the heavily blurred luminance mixed with a vertical
    ramp (the bottom of a photo is usually nearer than its top), stretched to [0, 1].

    Args:
        image: A PIL image, or an ``[H, W, 3]`` float array in [0, 1] (a pipeline's ``"np"`` output).
        blur: The side of the box blur, in pixels (odd).

    Returns:
        An RGB PIL image of the input's size.
    """
    gray = _luminance(image)
    pad = blur // 2
    smooth = F.avg_pool2d(F.pad(gray, (pad, pad, pad, pad), mode="replicate"), blur, stride=1)
    height = gray.shape[2]
    ramp = torch.linspace(0.0, 1.0, height).view(1, 1, height, 1).expand_as(smooth)
    depth = 0.5 * smooth + 0.5 * ramp
    low, high = depth.min(), depth.max()
    return _to_image((depth - low) / (high - low).clamp_min(1e-6))
