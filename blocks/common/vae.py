"""What every family asks of its VAE: the scale factor, latent samples, an image processor sized for it."""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = [
    "vae_scale_factor",
    "patched_latent_size",
    "retrieve_latents",
    "sample_latents",
    "shift_and_scale",
    "encode_shifted_latents",
    "unscale_and_shift",
    "processor_for_vae",
]


def vae_scale_factor(components: Any) -> int:
    """How many pixels one latent cell covers: 2 per VAE down level, as the classic pipelines compute it.

    8 when no VAE is loaded (the classic pipelines' fallback).
    """
    vae = getattr(components, "vae", None)
    if vae is None:
        return 8
    return 2 ** (len(vae.config.block_out_channels) - 1)


def patched_latent_size(components: Any, height: int, width: int) -> tuple[int, int]:
    """The latent height and width of an image for a transformer that reads 2x2 latent patches (Flux, Z-Image).

    The image size over the VAE scale, rounded down to even, so that the latents split into whole patches.
    """
    patch = vae_scale_factor(components) * 2
    return 2 * (int(height) // patch), 2 * (int(width) // patch)


def retrieve_latents(encoder_output: Any, generator: torch.Generator | None = None) -> torch.Tensor:
    """A sample of the VAE's latent distribution (drawn with `generator`), or the encoder's plain latents."""
    if hasattr(encoder_output, "latent_dist"):
        return encoder_output.latent_dist.sample(generator)
    if hasattr(encoder_output, "latents"):
        return encoder_output.latents
    msg = f"retrieve_latents: the VAE's encode output ({type(encoder_output).__name__}) has neither latent_dist nor latents"
    raise AttributeError(msg)


def sample_latents(
    vae: Any, image: torch.Tensor, generator: torch.Generator | list[torch.Generator] | None
) -> torch.Tensor:
    """Encode pixel images [B, 3, H, W] in [-1, 1] to a sample of the VAE's latents, not yet scaled.

    With a list of generators, image ``i`` is encoded alone and sampled with ``generator[i]`` (extra
    generators are unused), as the classic pipelines do.
    """
    if not isinstance(generator, list):
        return retrieve_latents(vae.encode(image), generator=generator)
    if len(generator) < image.shape[0]:
        msg = (
            f"generator: a list of generators needs one per image (got {len(generator)} generators for "
            f"{image.shape[0]} images); pass one generator or a list of length {image.shape[0]}"
        )
        raise ValueError(msg)
    return torch.cat(
        [
            retrieve_latents(vae.encode(image[i : i + 1]), generator=generator[i])
            for i in range(image.shape[0])
        ]
    )


def shift_and_scale(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Latents as a transformer sees them from a VAE with a shift (Flux, Z-Image): (x - shift) * scale."""
    return (latents - vae.config.shift_factor) * vae.config.scaling_factor


def encode_shifted_latents(
    vae: Any, image: torch.Tensor, generator: torch.Generator | list[torch.Generator] | None
) -> torch.Tensor:
    """Encode pixel images [B, 3, H, W] in [-1, 1] to shifted and scaled latents (``sample_latents``, then
    ``shift_and_scale``)."""
    return shift_and_scale(vae, sample_latents(vae, image, generator))


def unscale_and_shift(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """The inverse of `shift_and_scale`: what the VAE decodes, x / scale + shift."""
    return latents / vae.config.scaling_factor + vae.config.shift_factor


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
    # Only what the class's own __init__ takes: a subclass may drop keys its base registers (Flux2ImageProcessor
    # has no resample), and from_config warns about each key it does not expect.
    accepted = inspect.signature(type(processor)).parameters
    own = {key: value for key, value in config.items() if not key.startswith("_") and key in accepted}
    return type(processor).from_config({**own, **wanted})
