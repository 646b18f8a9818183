"""Tiny Stable Diffusion 3 repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json``, one subfolder per
component, safetensors weights, CLIP and T5 tokenizer files) of tiny random models, saved with the
libraries' own ``save_pretrained``, so that loading it runs the same code as loading a real repo.
The sizes: an MMDiT of two layers (4 heads of 8) reading 2x2 patches of 16-channel latents (SD3's
latent channels), a 2-level VAE (2 pixels per latent cell: a 32x32 image is 16x16 latents, 64 tokens),
two 5-layer CLIP text models of width 32 with projections, and a 2-layer T5 encoder of width 80 (wider
than the two CLIP widths side by side, so the CLIP part is zero-padded as in SD3).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from blocks.common.tiny import (
    make_tiny_clip_tokenizer,
    make_tiny_t5_tokenizer,
    tiny_clip_config,
    tiny_t5,
    tiny_vae,
    write_variant_weights,
)

__all__ = ["LATENT_CHANNELS", "make_tiny_repo"]

LATENT_CHANNELS = 16  # SD3's; the classic inpainting pipeline takes 16 channels as latents
_T5_WIDTH = 80

# The scheduler config SD3 repos ship: a fixed shift of 3.
_SCHEDULER_CONFIG = {"num_train_timesteps": 1000, "shift": 3.0}

_MODEL_FOLDERS = ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")


def _transformer(inpaint: bool):
    """An SD3Transformer2DModel over 2x2 patches of the latents; an inpainting one also reads mask and masked image."""
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=2 * LATENT_CHANNELS + 1 if inpaint else LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=_T5_WIDTH,
        caption_projection_dim=32,
        pooled_projection_dim=64,  # CLIP-L's and CLIP-G's projections side by side
        pos_embed_max_size=16,
    )


def _tiny_models(inpaint: bool, t5: bool, seed: int) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import CLIPTextModelWithProjection

    torch.manual_seed(seed)
    transformer = _transformer(inpaint)
    torch.manual_seed(seed + 1)
    vae = tiny_vae(
        (4, 8),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=1,
        sample_size=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModelWithProjection(tiny_clip_config())
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(tiny_clip_config(num_hidden_layers=4))
    torch.manual_seed(seed + 4)
    text_encoder_3 = tiny_t5(d_model=_T5_WIDTH, d_kv=8, d_ff=37, num_layers=2, num_heads=4) if t5 else None
    return {
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "text_encoder_2": text_encoder_2.eval(),
        "text_encoder_3": None if text_encoder_3 is None else text_encoder_3.eval(),
        "scheduler": FlowMatchEulerDiscreteScheduler(**_SCHEDULER_CONFIG),
    }


def make_tiny_repo(
    folder: str | Path,
    variant: str | None = None,
    *,
    inpaint: bool = False,
    t5: bool = True,
    seed: int = 0,
) -> Path:
    """Write a tiny random Stable Diffusion 3 repo in the diffusers layout.

    The folder gets ``model_index.json`` (``StableDiffusion3Pipeline``, or ``StableDiffusion3InpaintPipeline``
    with ``inpaint=True``) and ``transformer/``, ``vae/``, ``text_encoder/`` and ``text_encoder_2/`` (CLIP with
    projection), ``text_encoder_3/`` (T5), ``tokenizer/``, ``tokenizer_2/``, ``tokenizer_3/`` and ``scheduler/``
    (FlowMatchEulerDiscreteScheduler, shift 3). An inpainting repo's transformer reads 33 channels (latents,
    mask, masked image). With ``t5=False`` the repo has no T5 (``text_encoder_3`` and ``tokenizer_3`` null), as
    some SD3 repos are used. Weights are float32 safetensors; with a `variant`, variant files
    (``*.<variant>.safetensors``) in the variant's dtype are written beside the plain ones, as hub repos do.

    The same arguments always write the same weights; ``inpaint`` changes the transformer only.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"fp16"``.
        inpaint: write an inpainting transformer and name ``StableDiffusion3InpaintPipeline``.
        t5: write the T5 encoder and tokenizer.
        seed: the seed of the random weights.

    Returns:
        The repo folder as a Path.
    """
    from diffusers import StableDiffusion3InpaintPipeline, StableDiffusion3Pipeline

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = _tiny_models(inpaint, t5, seed)
    with tempfile.TemporaryDirectory() as tok_dir, tempfile.TemporaryDirectory() as tok_2_dir:
        tokenizer = make_tiny_clip_tokenizer(tok_dir)
        tokenizer_2 = make_tiny_clip_tokenizer(tok_2_dir)
        tokenizer_3 = make_tiny_t5_tokenizer(Path(tok_dir) / "t5") if t5 else None
    pipeline_class = StableDiffusion3InpaintPipeline if inpaint else StableDiffusion3Pipeline
    pipe = pipeline_class(
        **models,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        tokenizer_3=tokenizer_3,
        image_encoder=None,
        feature_extractor=None,
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    if variant is not None:
        write_variant_weights(folder, models, _MODEL_FOLDERS, variant)
    return folder
