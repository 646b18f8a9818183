"""What the Wan blocks share: component specs, the repo's configs, sizes, guidance and the prompt cleaning."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from blocks.common.guidance import guidance_scale_of
from modular import ComponentSpec, ConfigSpec, InputParam

__all__ = [
    "BOUNDARY_RATIO",
    "DEFAULT_FRAMES",
    "DEFAULT_HEIGHT",
    "DEFAULT_WIDTH",
    "EXPAND_TIMESTEPS",
    "GUIDANCE_SCALE",
    "MODEL_NAME",
    "SCHEDULER",
    "TRANSFORMER",
    "TRANSFORMER_2",
    "VAE",
    "VIDEO_PROCESSOR",
    "clean_prompts",
    "denoiser",
    "do_classifier_free_guidance",
    "guidance_scale",
    "guidance_scale_input",
    "latent_frames",
    "scale_factors",
]

MODEL_NAME = "wan"

TRANSFORMER = ComponentSpec(
    "transformer",
    "diffusers.WanTransformer3DModel",
    description="The denoiser (Wan 2.2: the expert for high noise, timesteps at or above the boundary).",
)
TRANSFORMER_2 = ComponentSpec(
    "transformer_2",
    "diffusers.WanTransformer3DModel",
    description="Wan 2.2: the expert for low noise (timesteps below the boundary); absent in Wan 2.1 repos.",
)
SCHEDULER = ComponentSpec(
    "scheduler",
    "diffusers.UniPCMultistepScheduler",
    description="The scheduler (UniPC over flow sigmas, shifted by flow_shift, in the published repos).",
)
VAE = ComponentSpec("vae", "diffusers.AutoencoderKLWan")
# Made from config before the VAE is known; the blocks resize with the loaded VAE's spatial scale
# (processor_for_vae), as the classic pipelines build theirs from the VAE.
VIDEO_PROCESSOR = ComponentSpec(
    "video_processor",
    "diffusers.video_processor.VideoProcessor",
    config={"vae_scale_factor": 8},
    default_creation_method="from_config",
)

BOUNDARY_RATIO = ConfigSpec(
    "boundary_ratio",
    None,
    "Wan 2.2: transformer denoises timesteps >= boundary_ratio x num_train_timesteps, transformer_2 the rest; "
    "None: transformer alone (Wan 2.1).",
)
EXPAND_TIMESTEPS = ConfigSpec(
    "expand_timesteps",
    False,
    "Wan 2.2 TI2V: one timestep per latent patch (the first frame's at 0 for image-to-video).",
)

# The classic pipelines' defaults.
DEFAULT_HEIGHT, DEFAULT_WIDTH, DEFAULT_FRAMES = 480, 832, 81
GUIDANCE_SCALE = 5.0


def scale_factors(components: Any) -> tuple[int, int]:
    """(temporal, spatial): frames and pixels per latent cell, from the VAE's config (4 and 8 without one)."""
    vae = getattr(components, "vae", None)
    if vae is None:
        return 4, 8
    return vae.config.scale_factor_temporal, vae.config.scale_factor_spatial


def latent_frames(components: Any, num_frames: int) -> int:
    """The latent frames of `num_frames` frames: the first frame alone, then one per temporal scale."""
    temporal, _ = scale_factors(components)
    return (num_frames - 1) // temporal + 1


def denoiser(components: Any) -> Any:
    """The model whose configs the blocks read: ``transformer``, else ``transformer_2`` (as the classic pipelines)."""
    model = getattr(components, "transformer", None)
    return model if model is not None else getattr(components, "transformer_2", None)


def guidance_scale_input() -> InputParam:
    """``guidance_scale``: classifier-free guidance for scales above 1, defaulting to the guider's own."""
    return InputParam.template(
        "guidance_scale",
        default=None,
        description=(
            "Classifier-free guidance scale: pred = neg + scale * (pos - neg), on for scales above 1 (Wan 2.2: "
            f"for the high-noise expert). Default: the guider's own ({GUIDANCE_SCALE} for the default guider)."
        ),
    )


def guidance_scale(components: Any, given: float | None) -> float:
    """The call's guidance scale: `given`, else the guider's own (``guidance_scale_of``)."""
    return guidance_scale_of(components, given, GUIDANCE_SCALE)


def do_classifier_free_guidance(scale: float) -> bool:
    """The classic Wan pipelines guide for scales above 1 (``guidance_scale`` decides for both experts)."""
    return scale > 1.0


def clean_prompts(prompts: list[str]) -> list[str]:
    """Each prompt as the classic pipelines clean it (ftfy's text fixes, HTML unescaped, whitespace collapsed).

    Raises:
        ImportError: ftfy is not installed (the classic pipelines would silently skip its fixes).
    """
    if importlib.util.find_spec("ftfy") is None:
        msg = (
            "Wan's prompt cleaning needs the ftfy package, which is not installed; install the video extra: "
            'pip install ".[video]"'
        )
        raise ImportError(msg)
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    return [prompt_clean(text) for text in prompts]


def embeds_dtype(components: Any) -> torch.dtype:
    """The dtype the transformer reads embeddings in (the classic pipelines cast them to it)."""
    return denoiser(components).dtype
