"""Tiny Stable Diffusion repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json``, one subfolder per
component, safetensors weights, CLIP tokenizer files) of tiny random models, saved with the
libraries' own ``save_pretrained``, so that loading it runs the same code as loading a real repo.
The models are the size diffusers' own fast tests use: a UNet with channels (32, 64), a 5-layer
CLIP text model of width 32, and a 2-level VAE (2 pixels per latent cell; ``vae_levels`` changes it),
so one 64x64 image takes a fraction of a second.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from blocks.common.bpe import bytes_to_unicode

__all__ = ["make_tiny_repo", "make_tiny_tokenizer"]

# Special tokens sit at fixed ids so that the text model's config can name them.
_BOS, _EOS = "<|startoftext|>", "<|endoftext|>"
_BOS_ID, _EOS_ID = 0, 1
# A few words get merged tokens so that prompts tokenize into whole words, as with a real vocab.
_WORDS = ("a", "photo", "of", "cat", "dog", "the", "astronaut", "riding", "horse", "red", "blue", "blurry")

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

_VARIANT_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _vocab_and_merges() -> tuple[dict[str, int], list[str]]:
    """A ~600-token CLIP-style vocabulary: specials, every byte alone and word-final, and word merges."""
    vocab: dict[str, int] = {_BOS: _BOS_ID, _EOS: _EOS_ID}
    for char in bytes_to_unicode():
        vocab.setdefault(char, len(vocab))
    for char in bytes_to_unicode():
        vocab.setdefault(char + "</w>", len(vocab))
    merges: list[str] = []
    for word in _WORDS:
        # Merge left to right: ((w o) r) d</w>; each merge's result becomes a token.
        symbols = list(word[:-1]) + [word[-1] + "</w>"]
        current = symbols[0]
        for nxt in symbols[1:]:
            merge = f"{current} {nxt}"
            current = current + nxt
            if merge not in merges:
                merges.append(merge)
            vocab.setdefault(current, len(vocab))
    return vocab, merges


def make_tiny_tokenizer(folder: str | Path):
    """Write ``vocab.json`` and ``merges.txt`` into `folder`, build a CLIPTokenizer from them, save it there.

    Args:
        folder: where the tokenizer files go (created if missing).

    Returns:
        The ``transformers.CLIPTokenizer`` read back from the files.
    """
    from transformers import CLIPTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = _vocab_and_merges()
    with tempfile.TemporaryDirectory() as raw:
        raw_dir = Path(raw)
        (raw_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        (raw_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
        tokenizer = CLIPTokenizer(
            vocab=str(raw_dir / "vocab.json"), merges=str(raw_dir / "merges.txt"), model_max_length=77
        )
    tokenizer.save_pretrained(folder)
    # Keep the plain BPE files beside tokenizer.json, as real SD repos do.
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return CLIPTokenizer.from_pretrained(folder)


def _tiny_models(inpainting: bool, seed: int, vae_levels: int = 2) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=2,
        sample_size=32,
        in_channels=9 if inpainting else 4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(
        block_out_channels=(32, *[64] * (vae_levels - 1)),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * vae_levels,
        up_block_types=("UpDecoderBlock2D",) * vae_levels,
        latent_channels=4,
        sample_size=64,
    )
    torch.manual_seed(seed + 2)
    text_config = CLIPTextConfig(
        bos_token_id=_BOS_ID,
        eos_token_id=_EOS_ID,
        pad_token_id=_EOS_ID,
        hidden_size=32,
        intermediate_size=37,
        layer_norm_eps=1e-05,
        num_attention_heads=4,
        num_hidden_layers=5,
        vocab_size=1000,
        projection_dim=32,
    )
    text_encoder = CLIPTextModel(text_config).eval()
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
    vocab, merges = _vocab_and_merges()
    (folder / "tokenizer" / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer" / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8"
    )
    if variant is not None:
        dtype = _VARIANT_DTYPES.get(variant, torch.float32)
        for name in ("unet", "vae", "text_encoder"):
            # Save to a scratch folder and keep only the weights: the config stays the plain one.
            with tempfile.TemporaryDirectory() as scratch:
                models[name].to(dtype).save_pretrained(scratch, safe_serialization=True, variant=variant)
                for weights in Path(scratch).glob(f"*.{variant}.safetensors"):
                    shutil.copyfile(weights, folder / name / weights.name)
    return folder
