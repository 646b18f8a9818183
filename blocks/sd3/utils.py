"""Small helpers the Stable Diffusion 3 blocks share: component specs, sizes, guidance, the timestep shift."""

from __future__ import annotations

from typing import Any

import torch

from blocks.common.guidance import guidance_scale_of
from blocks.common.params import tensor_input
from blocks.common.vae import processor_for_vae, vae_scale_factor
from modular import ComponentSpec, InputParam

__all__ = [
    "MODEL_NAME",
    "SCHEDULER",
    "TRANSFORMER",
    "IMAGE_PROCESSOR",
    "MASK_PROCESSOR",
    "GUIDANCE_SCALE",
    "MAX_SHIFT",
    "image_processor_for_vae",
    "mask_processor_for_vae",
    "patch_size",
    "size_multiple",
    "default_size",
    "guidance_scale",
    "guidance_scale_input",
    "do_classifier_free_guidance",
    "pooled_input",
    "set_sd3_timesteps",
]

MODEL_NAME = "stable-diffusion-3"

SCHEDULER = ComponentSpec(
    "scheduler",
    "diffusers.FlowMatchEulerDiscreteScheduler",
    description="The flow-matching Euler scheduler (a fixed shift; SD 3.5 configs may shift by mu).",
)
TRANSFORMER = ComponentSpec("transformer", "diffusers.SD3Transformer2DModel")

# Made from config before the VAE is known, so the blocks resize with the loaded VAE's values instead
# (image_processor_for_vae), which the classic pipelines derive from it.
IMAGE_PROCESSOR = ComponentSpec(
    "image_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={"vae_scale_factor": 8, "vae_latent_channels": 16},
    default_creation_method="from_config",
)
# The classic inpainting pipeline's mask processor: grayscale, binarized, not normalized to [-1, 1].
MASK_PROCESSOR = ComponentSpec(
    "mask_processor",
    "diffusers.image_processor.VaeImageProcessor",
    config={
        "vae_scale_factor": 8,
        "vae_latent_channels": 16,
        "do_normalize": False,
        "do_binarize": True,
        "do_convert_grayscale": True,
    },
    default_creation_method="from_config",
)

GUIDANCE_SCALE = 7.0  # the classic pipelines' default, and the default guider's
# The classic pipelines' fallback for a scheduler config without max_shift (FLUX.1's is 1.15).
MAX_SHIFT = 1.16


def _vae_settings(components: Any) -> dict[str, Any]:
    vae = getattr(components, "vae", None)
    return {} if vae is None else {"vae_latent_channels": vae.config.latent_channels}


def image_processor_for_vae(components: Any) -> Any:
    """The image processor, sized for the loaded VAE (its scale and latent channels), as the classic pipelines."""
    return processor_for_vae(
        components.image_processor, vae_scale_factor(components), **_vae_settings(components)
    )


def mask_processor_for_vae(components: Any) -> Any:
    """The mask processor, sized for the loaded VAE, as the classic inpainting pipeline's."""
    return processor_for_vae(
        components.mask_processor, vae_scale_factor(components), **_vae_settings(components)
    )


def patch_size(components: Any) -> int:
    """The transformer's patch size (SD3's 2 when none is loaded), read from its config: the steps that need it
    do not run the transformer, so they leave it out of the plan."""
    transformer = getattr(components, "transformer", None)
    return transformer.config.patch_size if transformer is not None else 2


def size_multiple(components: Any) -> int:
    """Height and width are multiples of the VAE scale x the transformer's patch size."""
    return vae_scale_factor(components) * patch_size(components)


def default_size(components: Any, height: int | None, width: int | None) -> tuple[int, int]:
    """``height`` and ``width``, each defaulting to the transformer's sample size in pixels (1024 for SD3)."""
    transformer = getattr(components, "transformer", None)
    sample_size = transformer.config.sample_size if transformer is not None else 128
    pixels = sample_size * vae_scale_factor(components)
    return height or pixels, width or pixels


def guidance_scale_input() -> InputParam:
    """``guidance_scale``, defaulting to the guider's own (``guidance_scale_of``)."""
    return InputParam.template(
        "guidance_scale",
        default=None,
        description=(
            "Classifier-free guidance scale; 1.0 or less turns guidance off. Default: the guider's own "
            f"({GUIDANCE_SCALE} for the default guider); a value given here holds for this call only."
        ),
    )


def guidance_scale(components: Any, given: float | None) -> float:
    """The call's guidance scale: `given`, else the guider's own (``guidance_scale_of``)."""
    return guidance_scale_of(components, given, GUIDANCE_SCALE)


def do_classifier_free_guidance(scale: float) -> bool:
    """Guidance runs for a scale above 1, as in the classic pipelines."""
    return scale > 1


def pooled_input(name: str, required: bool = False) -> InputParam:
    """A pooled text embedding: CLIP-L's and CLIP-G's projected outputs side by side, [B, D_L + D_G]."""
    what = "the negative prompt's" if name.startswith("negative") else "the prompt's"
    return tensor_input(name, f"Pooled CLIP-L and CLIP-G embeddings of {what} text, [B, D].", required)


def set_sd3_timesteps(
    scheduler: Any,
    num_inference_steps: int,
    sigmas: Any,
    mu: float | None,
    image_seq_len: int,
    device: torch.device,
) -> tuple[torch.Tensor, int]:
    """Set the scheduler's timesteps as the classic pipelines do: custom `sigmas` or `num_inference_steps`,
    shifted by `mu` when given, else by the mu of `image_seq_len` tokens when the config shifts dynamically.

    Returns:
        The timesteps and their count.
    """
    from blocks.common.timesteps import calculate_shift

    config = scheduler.config
    kwargs: dict[str, Any] = {}
    if config.get("use_dynamic_shifting", None) and mu is None:
        kwargs["mu"] = calculate_shift(
            image_seq_len,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", MAX_SHIFT),
        )
    elif mu is not None:
        kwargs["mu"] = mu
    if sigmas is None:
        scheduler.set_timesteps(num_inference_steps, device=device, **kwargs)
        return scheduler.timesteps, num_inference_steps
    scheduler.set_timesteps(sigmas=sigmas, device=device, **kwargs)
    return scheduler.timesteps, len(scheduler.timesteps)
