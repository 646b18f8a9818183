"""Tiny Stable Diffusion XL repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json``, one subfolder per
component, safetensors weights, CLIP tokenizer files) of tiny random models, saved with the
libraries' own ``save_pretrained``. The sizes are those of diffusers' own SDXL fast tests: a UNet with
channels (32, 64), ``addition_embed_type="text_time"`` and transformer layers (1, 2), two 5-layer CLIP
text encoders of width 32 (the second with a projection), a 2-level float32 VAE and the Euler scheduler
SDXL ships, so one 64x64 image takes a fraction of a second.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from blocks.common.tiny import (
    make_tiny_clip_tokenizer,
    tiny_clip_config,
    tiny_vae,
    write_variant_weights,
)
from blocks.stable_diffusion.tiny import make_tiny_ip_adapter, tiny_unet

__all__ = ["make_tiny_ip_adapter", "make_tiny_repo"]

# The scheduler config the SDXL base and refiner repos ship.
_SCHEDULER_CONFIG = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "interpolation_type": "linear",
    "prediction_type": "epsilon",
    "use_karras_sigmas": False,
}

_TEXT_WIDTH = 32  # the tiny CLIP text models' width
_TIME_EMBED_DIM = 8


def _text_config():
    return tiny_clip_config(hidden_act="gelu")


def _tiny_models(refiner: bool, inpainting: bool, seed: int) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import EulerDiscreteScheduler
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    # time ids: original size (2) + crop (2) + target size (2), or + aesthetic score (1) for a refiner.
    time_ids = 5 if refiner else 6
    torch.manual_seed(seed)
    unet = tiny_unet(
        inpainting,
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=_TIME_EMBED_DIM,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=time_ids * _TIME_EMBED_DIM + _TEXT_WIDTH,
        # The base UNet attends to both encoders' hidden states side by side; a refiner to the second only.
        cross_attention_dim=_TEXT_WIDTH if refiner else 2 * _TEXT_WIDTH,
        norm_num_groups=1,
    )
    torch.manual_seed(seed + 1)
    vae = tiny_vae((32, 64), latent_channels=4, sample_size=128, scaling_factor=0.13025, force_upcast=True)
    models: dict[str, Any] = {"unet": unet.eval(), "vae": vae.eval()}
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(_text_config()).eval()
    torch.manual_seed(seed + 3)
    models["text_encoder_2"] = CLIPTextModelWithProjection(_text_config()).eval()
    models["text_encoder"] = None if refiner else text_encoder
    models["scheduler"] = EulerDiscreteScheduler(**_SCHEDULER_CONFIG)
    return models


def make_tiny_repo(
    folder: str | Path,
    variant: str | None = None,
    *,
    refiner: bool = False,
    inpainting: bool = False,
    seed: int = 0,
) -> Path:
    """Write a tiny random Stable Diffusion XL repo in the diffusers layout.

    The base repo's ``model_index.json`` names ``StableDiffusionXLPipeline`` and has ``unet/``, ``vae/``,
    ``text_encoder/``, ``text_encoder_2/``, ``tokenizer/``, ``tokenizer_2/``, ``scheduler/``, with
    ``force_zeros_for_empty_prompt: true``. With ``refiner=True`` it is a refiner-style repo as
    ``stable-diffusion-xl-refiner-1.0``: ``StableDiffusionXLImg2ImgPipeline``, no ``text_encoder`` nor
    ``tokenizer``, a UNet conditioned on ``text_encoder_2`` alone with aesthetic-score time ids
    (``requires_aesthetics_score: true``, ``force_zeros_for_empty_prompt: false``). With
    ``inpainting=True`` it names ``StableDiffusionXLInpaintPipeline`` and has a 9-channel UNet. Weights are float32
    safetensors; with a `variant`, variant files in the variant's dtype (float16 for ``"fp16"``, bfloat16
    for ``"bf16"``, float32 otherwise) are written beside the plain ones, as hub repos do.

    The same arguments always write the same weights.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"fp16"``.
        refiner: write a refiner-style image-to-image repo.
        inpainting: write a 9-channel inpainting UNet and name the inpainting pipeline.
        seed: the seed of the random weights.

    Returns:
        The repo folder as a Path.
    """
    from diffusers import (
        StableDiffusionXLImg2ImgPipeline,
        StableDiffusionXLInpaintPipeline,
        StableDiffusionXLPipeline,
    )

    if refiner and inpainting:
        msg = "make_tiny_repo: refiner and inpainting repos are separate kinds; pass one of them"
        raise ValueError(msg)

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = _tiny_models(refiner, inpainting, seed)
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = make_tiny_clip_tokenizer(tok_dir)
    shared: dict[str, Any] = {"image_encoder": None, "feature_extractor": None, "add_watermarker": False}
    if refiner:
        pipe = StableDiffusionXLImg2ImgPipeline(
            **models,
            tokenizer=None,
            tokenizer_2=tokenizer,
            requires_aesthetics_score=True,
            force_zeros_for_empty_prompt=False,
            **shared,
        )
    else:
        pipeline_class = StableDiffusionXLInpaintPipeline if inpainting else StableDiffusionXLPipeline
        pipe = pipeline_class(
            **models, tokenizer=tokenizer, tokenizer_2=tokenizer, force_zeros_for_empty_prompt=True, **shared
        )
    pipe.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer", "tokenizer_2"):
        if (folder / name).is_dir():
            # Rewrite with the plain BPE files (vocab.json, merges.txt) beside tokenizer.json, as real repos.
            make_tiny_clip_tokenizer(folder / name)
    if variant is not None:
        write_variant_weights(folder, models, ("unet", "vae", "text_encoder", "text_encoder_2"), variant)
    return folder
