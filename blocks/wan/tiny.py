"""Tiny Wan repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json`` naming ``WanPipeline`` or
``WanImageToVideoPipeline``, one subfolder per component, safetensors weights, a T5 tokenizer) of tiny
random models, saved with the libraries' own ``save_pretrained``, so loading it runs the code a real
repo runs. The sizes follow diffusers' own Wan fast tests: 2-layer WanTransformer3DModels of 2 heads of
12, a 16-channel AutoencoderKLWan of base width 3 (8 pixels and 4 frames per latent cell), a 2-layer
UMT5 encoder of width 32, and for Wan 2.1 image-to-video a 2-layer CLIP vision model of width 4. Five
frames of 32x32 pixels are 2 latent frames of 4x4 cells: a call takes a fraction of a second.

The kinds of repo (``kind=``) are the published layouts:

- ``"wan2.1"``: text-to-video with one transformer (``transformer_2`` listed as ``[null, null]``);
- ``"wan2.2"``: text-to-video with two experts (``transformer`` for high noise, ``transformer_2`` for low
  noise, ``boundary_ratio`` 0.875, as Wan2.2-T2V-A14B);
- ``"wan2.1-i2v"``: image-to-video with a CLIP image encoder and one transformer (Wan2.1-I2V);
- ``"wan2.2-i2v"``: image-to-video with two experts and no image encoder (``boundary_ratio`` 0.9, as
  Wan2.2-I2V-A14B).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from blocks.common.tiny import make_tiny_t5_tokenizer, write_variant_weights

__all__ = ["KINDS", "make_tiny_repo"]

KINDS = ("wan2.1", "wan2.2", "wan2.1-i2v", "wan2.2-i2v")

# Wan's scheduler: UniPC over flow sigmas, shifted by flow_shift (3.0 for 480p in the published repos).
_SCHEDULER_CONFIG = {
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
}
_BOUNDARY_RATIO = {"wan2.2": 0.875, "wan2.2-i2v": 0.9}
_TEXT_DIM = 32
_IMAGE_DIM = 4
_MODEL_FOLDERS = ("transformer", "transformer_2", "vae", "text_encoder", "image_encoder")


def _transformer(seed: int, image_to_video: bool, image_dim: int | None):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        # Image-to-video reads the noise (16), the first-frame mask (4) and the image latents (16).
        in_channels=36 if image_to_video else 16,
        out_channels=16,
        text_dim=_TEXT_DIM,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        image_dim=image_dim,
        rope_max_seq_len=32,
    ).eval()


def _tiny_models(kind: str, seed: int) -> dict[str, Any]:
    """The random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
    from transformers import UMT5Config, UMT5EncoderModel

    image_to_video = kind.endswith("-i2v")
    with_image_encoder = kind == "wan2.1-i2v"
    models: dict[str, Any] = {
        "transformer": _transformer(seed, image_to_video, _IMAGE_DIM if with_image_encoder else None),
        "transformer_2": (_transformer(seed + 10, image_to_video, None) if kind in _BOUNDARY_RATIO else None),
    }
    torch.manual_seed(seed + 1)
    models["vae"] = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()
    torch.manual_seed(seed + 2)
    models["text_encoder"] = UMT5EncoderModel(
        UMT5Config(vocab_size=64, d_model=_TEXT_DIM, d_kv=8, d_ff=32, num_layers=2, num_heads=2)
    ).eval()
    models["scheduler"] = UniPCMultistepScheduler(**_SCHEDULER_CONFIG)
    if image_to_video:
        models["image_encoder"], models["image_processor"] = _image_encoder(seed + 3, with_image_encoder)
    return models


def _image_encoder(seed: int, wanted: bool) -> tuple[Any, Any]:
    """Wan 2.1's CLIP vision model and its processor (32x32 images, patches of one pixel); none for Wan 2.2."""
    if not wanted:
        return None, None
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    config = CLIPVisionConfig(
        hidden_size=_IMAGE_DIM,
        projection_dim=_IMAGE_DIM,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        intermediate_size=16,
        patch_size=1,
    )
    return CLIPVisionModel(config).eval(), CLIPImageProcessor(crop_size=32, size=32)


def make_tiny_repo(
    folder: str | Path, variant: str | None = None, *, kind: str = "wan2.2", seed: int = 0
) -> Path:
    """Write a tiny random Wan repo in the diffusers layout.

    The folder gets ``model_index.json`` and ``transformer/``, ``vae/`` (``AutoencoderKLWan``),
    ``text_encoder/`` (``UMT5EncoderModel``), ``tokenizer/`` (a T5 tokenizer) and ``scheduler/``
    (``UniPCMultistepScheduler``, flow sigmas with flow_shift 3), plus per `kind` (see the module's
    docstring) ``transformer_2/`` and ``boundary_ratio``, or ``image_encoder/`` and ``image_processor/``.
    Components a kind lacks are listed as ``[null, null]``, as the published repos list them. Weights are
    float32 safetensors; with a `variant`, variant weight files are written beside them.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"bf16"``.
        kind: one of ``KINDS``; the default is Wan 2.2 text-to-video (two experts).
        seed: the seed of the random weights.

    Returns:
        The repo folder as a Path.
    """
    from diffusers import WanImageToVideoPipeline, WanPipeline

    if kind not in KINDS:
        msg = f"make_tiny_repo: kind ({kind!r}) must be one of {list(KINDS)}"
        raise ValueError(msg)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = _tiny_models(kind, seed)
    pipeline_class = WanImageToVideoPipeline if kind.endswith("-i2v") else WanPipeline
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = make_tiny_t5_tokenizer(tok_dir)
    pipeline = pipeline_class(**models, tokenizer=tokenizer, boundary_ratio=_BOUNDARY_RATIO.get(kind))
    pipeline.save_pretrained(folder, safe_serialization=True)
    _list_absent_components(folder / "model_index.json", models)
    if variant is not None:
        present = tuple(name for name in _MODEL_FOLDERS if models.get(name) is not None)
        write_variant_weights(folder, models, present, variant)
    return folder


def _list_absent_components(index_path: Path, models: dict[str, Any]) -> None:
    """List every component the kind lacks as ``[null, null]`` (save_pretrained leaves some out)."""
    index = json.loads(index_path.read_text())
    for name, model in models.items():
        if model is None:
            index[name] = [None, None]
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
