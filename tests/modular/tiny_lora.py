"""A random LoRA over the tiny Stable Diffusion repo's UNet and text encoder, as the adapter tests use it."""

from pathlib import Path

from diffusers import StableDiffusionPipeline

from modular import ComponentsManager
from tests.blocks.lora_helpers import CLIP_TARGETS, DENOISER_TARGETS, make_lora

from .tiny_sd import tiny_sd_pipeline


def tiny_sd_lora(repo: Path, folder: Path, seed: int = 0) -> Path:
    """A LoRA folder for `repo` (rank 4, alpha 4) over the UNet's and the text encoder's attention."""
    pipe = tiny_sd_pipeline(repo, ComponentsManager())
    targets = {"unet": (pipe.unet, DENOISER_TARGETS), "text_encoder": (pipe.text_encoder, CLIP_TARGETS)}
    return make_lora(folder, StableDiffusionPipeline, targets, seed=seed, alpha=4.0)
