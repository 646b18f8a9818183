"""Tiny Stable Diffusion repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json``, one subfolder per
component, safetensors weights, CLIP tokenizer files) of tiny random models, saved with the
libraries' own ``save_pretrained``, so that loading it runs the same code as loading a real repo.
The models are the size diffusers' own fast tests use: a UNet with channels (32, 64), a 5-layer
CLIP text model of width 32, and a 2-level VAE (2 pixels per latent cell; ``vae_levels`` changes it),
so one 64x64 image takes a fraction of a second.
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
    write_bpe_files,
    write_variant_weights,
)
from blocks.common.tiny_ip_adapter import IPAttentionLayer, write_tiny_ip_adapter

__all__ = ["make_tiny_ip_adapter", "make_tiny_repo", "make_tiny_tokenizer", "tiny_unet"]

make_tiny_tokenizer = make_tiny_clip_tokenizer
"""The tiny CLIP tokenizer (``blocks.common.tiny.make_tiny_clip_tokenizer``), under this family's name."""

# The scheduler config Stable Diffusion v1.x repos ship.
_SCHEDULER_CONFIG = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
}


def tiny_unet(inpainting: bool, **config: Any):
    """A UNet2DConditionModel with channels (32, 64), as diffusers' fast tests use, and `config`.

    An inpainting UNet takes 9 input channels: the latents (4), the mask (1) and the masked image's
    latents (4).
    """
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=2,
        sample_size=32,
        in_channels=9 if inpainting else 4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        **config,
    )


def _tiny_models(inpainting: bool, seed: int, vae_levels: int = 2) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import PNDMScheduler
    from transformers import CLIPTextModel

    torch.manual_seed(seed)
    unet = tiny_unet(inpainting, cross_attention_dim=32)
    torch.manual_seed(seed + 1)
    vae = tiny_vae((32, *[64] * (vae_levels - 1)), latent_channels=4, sample_size=64)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(tiny_clip_config()).eval()
    scheduler = PNDMScheduler(**_SCHEDULER_CONFIG)
    return {"unet": unet.eval(), "vae": vae.eval(), "text_encoder": text_encoder, "scheduler": scheduler}


def make_tiny_repo(
    folder: str | Path,
    variant: str | None = None,
    *,
    inpainting: bool = False,
    seed: int = 0,
    vae_levels: int = 2,
) -> Path:
    """Write a tiny random Stable Diffusion repo in the diffusers layout.

    The folder gets ``model_index.json`` (``StableDiffusionPipeline``, or
    ``StableDiffusionInpaintPipeline`` with ``inpainting=True``), and ``unet/``, ``vae/``,
    ``text_encoder/``, ``tokenizer/``, ``scheduler/``; ``safety_checker`` and ``feature_extractor``
    are null. Weights are float32 safetensors. With a `variant`, variant files
    (``diffusion_pytorch_model.<variant>.safetensors``, ``model.<variant>.safetensors``) are written
    as well, beside the plain ones, holding the weights in the variant's dtype (float16 for
    ``"fp16"``, bfloat16 for ``"bf16"``, float32 otherwise), as hub repos do.

    The same arguments always write the same weights.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"fp16"``.
        inpainting: write a 9-channel inpainting UNet and name the inpainting pipeline.
        seed: the seed of the random weights.
        vae_levels: the VAE's resolution levels; its scale factor is ``2 ** (vae_levels - 1)`` pixels per
            latent cell (2 by default; SD's own VAE has 4 levels, 8 pixels).

    Returns:
        The repo folder as a Path.
    """
    from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if vae_levels < 1:
        msg = f"make_tiny_repo: vae_levels ({vae_levels}) must be at least 1; pass e.g. 2 or 3"
        raise ValueError(msg)
    models = _tiny_models(inpainting, seed, vae_levels)
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = make_tiny_tokenizer(tok_dir)
    pipeline_class = StableDiffusionInpaintPipeline if inpainting else StableDiffusionPipeline
    pipe = pipeline_class(
        **models,
        tokenizer=tokenizer,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    # save_pretrained does not keep the plain BPE files; write them for tools that read them.
    write_bpe_files(folder / "tokenizer")
    if variant is not None:
        write_variant_weights(folder, models, ("unet", "vae", "text_encoder"), variant)
    return folder


def make_tiny_ip_adapter(folder: str | Path, repo: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random IP-Adapter for the UNet of `repo` (SD or SDXL) into `folder`; returns `folder`.

    The layout is h94/IP-Adapter's: ``models/ip-adapter.safetensors`` and ``models/image_encoder/``. The file
    numbers the UNet's cross-attention layers 1, 3, 5, ... in ``attn_processors`` order, as diffusers reads it.
    """
    from diffusers import UNet2DConditionModel

    config = UNet2DConditionModel.load_config(Path(repo) / "unet")
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(config)
    cross = [name for name in unet.attn_processors if name.endswith("attn2.processor")]
    layers = [
        IPAttentionLayer(
            key=1 + 2 * index,
            hidden_size=unet.get_submodule(name.removesuffix(".processor")).to_q.in_features,
            cross_attention_dim=unet.config.cross_attention_dim,
        )
        for index, name in enumerate(cross)
    ]
    return write_tiny_ip_adapter(folder, layers, unet.config.cross_attention_dim, seed=seed)
