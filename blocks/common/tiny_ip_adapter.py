"""Tiny random IP-Adapters in diffusers' layout, for tests and examples, written offline.

An IP-Adapter repo (h94/IP-Adapter's layout) holds a weight file, ``<subfolder>/<weight_name>``, with an
image projection (``image_proj.*``: a plain IP-Adapter's linear map from the image embedding to 4 tokens,
and a norm) and per cross-attention layer the keys and values of the image tokens
(``ip_adapter.<n>.to_k_ip.weight``...), and a CLIP vision encoder in ``<subfolder>/image_encoder``. A
family's ``make_tiny_ip_adapter`` says which layers its denoiser has; this module writes the files.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs
import torch
from safetensors.torch import save_file

__all__ = ["IPAttentionLayer", "write_tiny_ip_adapter"]

#: The width of the tiny image encoder's embedding (``projection_dim``).
IMAGE_EMBED_DIM = 32


@attrs.frozen
class IPAttentionLayer:
    """One cross-attention layer of the denoiser, as the IP-Adapter file numbers it.

    Attributes:
        key: Its number in the file (``ip_adapter.<key>.to_k_ip.weight``).
        hidden_size: The attention's width (what ``to_k_ip`` makes).
        cross_attention_dim: The width of the image tokens (what ``to_k_ip`` reads).
        bias: Whether ``to_k_ip`` and ``to_v_ip`` have biases (Flux's do).
    """

    key: int
    hidden_size: int
    cross_attention_dim: int
    bias: bool = False


def _tiny_image_encoder(seed: int):
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=37,
        projection_dim=IMAGE_EMBED_DIM,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    )
    torch.manual_seed(seed)
    return CLIPVisionModelWithProjection(config).eval()


def write_tiny_ip_adapter(
    folder: str | Path,
    layers: Iterable[IPAttentionLayer],
    cross_attention_dim: int,
    *,
    seed: int = 0,
    subfolder: str = "models",
    weight_name: str = "ip-adapter.safetensors",
) -> Path:
    """Write a tiny random plain IP-Adapter for `layers` and its image encoder; returns the repo folder.

    Args:
        folder: The repo folder (created if missing).
        layers: The denoiser's cross-attention layers.
        cross_attention_dim: The width of the image tokens the projection makes.
        seed: The seed of the random weights (the same seed writes the same files).
        subfolder: The folder of the weight file and of ``image_encoder/``.
        weight_name: The weight file's name.
    """
    folder = Path(folder)
    target = folder / subfolder
    target.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int) -> torch.Tensor:
        return 0.1 * torch.randn(*shape, generator=generator)

    tokens = 4
    weights = {
        "image_proj.proj.weight": random(tokens * cross_attention_dim, IMAGE_EMBED_DIM),
        "image_proj.proj.bias": random(tokens * cross_attention_dim),
        "image_proj.norm.weight": 1 + random(cross_attention_dim),
        "image_proj.norm.bias": random(cross_attention_dim),
    }
    for layer in layers:
        for name in ("to_k_ip", "to_v_ip"):
            prefix = f"ip_adapter.{layer.key}.{name}"
            weights[f"{prefix}.weight"] = random(layer.hidden_size, layer.cross_attention_dim)
            if layer.bias:
                weights[f"{prefix}.bias"] = random(layer.hidden_size)
    save_file({key: value.contiguous() for key, value in weights.items()}, str(target / weight_name))
    _tiny_image_encoder(seed).save_pretrained(target / "image_encoder", safe_serialization=True)
    return folder
