"""What every family asks of its VAE: the scale factor, a latent sample, an image processor sized for it."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["vae_scale_factor", "retrieve_latents", "processor_for_vae"]


def vae_scale_factor(components: Any) -> int:
    """How many pixels one latent cell covers: 2 per VAE down level, as the classic pipelines compute it.

    8 when no VAE is loaded (the classic pipelines' fallback).
    """
    vae = getattr(components, "vae", None)
    if vae is None:
        return 8
    return 2 ** (len(vae.config.block_out_channels) - 1)


def retrieve_latents(encoder_output: Any, generator: torch.Generator | None = None) -> torch.Tensor:
    """A sample of the VAE's latent distribution (drawn with `generator`), or the encoder's plain latents."""
    if hasattr(encoder_output, "latent_dist"):
        return encoder_output.latent_dist.sample(generator)
    if hasattr(encoder_output, "latents"):
        return encoder_output.latents
    msg = f"retrieve_latents: the VAE's encode output ({type(encoder_output).__name__}) has neither latent_dist nor latents"
    raise AttributeError(msg)


def processor_for_vae(processor: Any, vae_scale: int, **settings: Any) -> Any:
    """`processor`, or a copy of it with ``vae_scale_factor=vae_scale`` (and `settings`) when it has others.

    The processor is a from-config component made before the VAE is known (and may be shared by
    several pipelines), so it is never changed: the classic pipelines build theirs from the loaded
    VAE, and a copy configured the same way resizes images to the same multiples.
    """
    wanted = {"vae_scale_factor": vae_scale, **settings}
    config = processor.config
    if all(config.get(key) == value for key, value in wanted.items()):
        return processor
    own = {key: value for key, value in config.items() if not key.startswith("_")}
    return type(processor).from_config({**own, **wanted})
