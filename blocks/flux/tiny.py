"""Tiny Flux repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json``, one subfolder per
component, safetensors weights, CLIP and T5 tokenizer files) of tiny random models, saved with the
libraries' own ``save_pretrained``, so that loading it runs the same code as loading a real repo.
The sizes follow diffusers' own Flux tests: a transformer of one double-stream and one
single-stream layer (2 heads of 16), a 2-level VAE with 4 latent channels (a 32x32 image is 16x16
latents, packed into 64 tokens), a 5-layer CLIP text model and a 2-layer T5 encoder of width 32.
The transformer has a guidance embedding, like FLUX.1-dev.
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
from blocks.common.tiny_ip_adapter import IPAttentionLayer, write_tiny_ip_adapter

__all__ = ["make_tiny_ip_adapter", "make_tiny_repo", "make_tiny_t5_tokenizer"]

LATENT_CHANNELS = 4

# The scheduler config FLUX.1-dev ships: resolution-dependent shift (mu) from the image sequence length.
_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}

_MODEL_FOLDERS = ("transformer", "vae", "text_encoder", "text_encoder_2")


def _vae(
    block_out_channels: tuple[int, ...],
    norm_num_groups: int,
    sample_size: int,
    latent_channels: int = LATENT_CHANNELS,
):
    """A VAE shaped like FLUX.1's, at the given width: 4 latent channels unless told (FLUX.1 has 16), a scaling and shift."""
    return tiny_vae(
        block_out_channels,
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=norm_num_groups,
        sample_size=sample_size,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )


def _transformer(control: bool, latent_channels: int = LATENT_CHANNELS, **sizes: Any):
    """A FluxTransformer2DModel over packed latents (a control one reads twice the channels), with guidance."""
    from diffusers import FluxTransformer2DModel

    packed = latent_channels * 4  # 2x2 patches of the VAE latents
    return FluxTransformer2DModel(
        patch_size=1,
        # A control transformer also reads the packed control-image latents, concatenated on channels.
        in_channels=packed * 2 if control else packed,
        out_channels=packed,
        pooled_projection_dim=32,
        guidance_embeds=True,
        **sizes,
    )


def _tiny_models(control: bool, seed: int, latent_channels: int = LATENT_CHANNELS) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import CLIPTextModel

    torch.manual_seed(seed)
    transformer = _transformer(
        control,
        latent_channels,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 4, 8),
    )
    torch.manual_seed(seed + 1)
    vae = _vae((4, 8), norm_num_groups=1, sample_size=32, latent_channels=latent_channels)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(tiny_clip_config())
    torch.manual_seed(seed + 3)
    text_encoder_2 = tiny_t5(d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4)
    return {
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "text_encoder_2": text_encoder_2.eval(),
        "scheduler": FlowMatchEulerDiscreteScheduler(**_SCHEDULER_CONFIG),
    }


def make_tiny_repo(
    folder: str | Path,
    variant: str | None = None,
    *,
    control: bool = False,
    seed: int = 0,
    latent_channels: int = LATENT_CHANNELS,
) -> Path:
    """Write a tiny random Flux repo in the diffusers layout.

    The folder gets ``model_index.json`` (``FluxPipeline``, or ``FluxControlPipeline`` with
    ``control=True``) and ``transformer/``, ``vae/``, ``text_encoder/`` (CLIP), ``text_encoder_2/``
    (T5), ``tokenizer/``, ``tokenizer_2/`` and ``scheduler/`` (FlowMatchEulerDiscreteScheduler with
    dynamic shifting). A control repo's transformer takes twice the input channels (latents and
    control-image latents, both packed). Weights are float32 safetensors; with a `variant`, variant
    files (``*.<variant>.safetensors``) in the variant's dtype (float16 for ``"fp16"``, bfloat16 for
    ``"bf16"``, float32 otherwise) are written beside the plain ones, as hub repos do.

    The same arguments always write the same weights; ``control`` changes the transformer only.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"fp16"``.
        control: write a control (canny/depth-style) transformer and name ``FluxControlPipeline``.
        seed: the seed of the random weights.
        latent_channels: the VAE's latent channels (FLUX.1's 16 for previews by its latent-to-RGB map).

    Returns:
        The repo folder as a Path.
    """
    from diffusers import FluxControlPipeline, FluxPipeline

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = _tiny_models(control, seed, latent_channels)
    with tempfile.TemporaryDirectory() as tok_dir, tempfile.TemporaryDirectory() as tok_2_dir:
        tokenizer = make_tiny_clip_tokenizer(tok_dir)
        tokenizer_2 = make_tiny_t5_tokenizer(tok_2_dir)
    pipeline_class = FluxControlPipeline if control else FluxPipeline
    extra = {} if control else {"image_encoder": None, "feature_extractor": None}
    pipe = pipeline_class(**models, tokenizer=tokenizer, tokenizer_2=tokenizer_2, **extra)
    pipe.save_pretrained(folder, safe_serialization=True)
    if variant is not None:
        write_variant_weights(folder, models, _MODEL_FOLDERS, variant)
    return folder


# ---- The seed's three repos at 1/1024 of their size: what `modular run` runs by default ----------------

SEED_SCALE_SIZE = 64
"""Pixels a side of the seed-scale images: a 3-level VAE makes 16x16 latents, packed into 64 tokens."""

_SHARED_COMPONENTS = {
    "text_encoder": ("transformers", "CLIPTextModel"),
    "text_encoder_2": ("transformers", "T5EncoderModel"),
    "tokenizer": ("transformers", "CLIPTokenizer"),
    "tokenizer_2": ("transformers", "T5Tokenizer"),
    "vae": ("diffusers", "AutoencoderKL"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
}
_TRANSFORMER = ("diffusers", "FluxTransformer2DModel")


def _seed_scale_transformer(control: bool, seed: int):
    torch.manual_seed(seed)
    return _transformer(
        control,
        num_layers=2,
        num_single_layers=5,
        attention_head_dim=48,
        num_attention_heads=4,
        joint_attention_dim=128,
        axes_dims_rope=(8, 20, 20),
    ).eval()


def _seed_scale_shared_models(seed: int) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import CLIPTextModel

    torch.manual_seed(seed + 1)
    vae = _vae((4, 8, 16), norm_num_groups=4, sample_size=SEED_SCALE_SIZE)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(tiny_clip_config(num_hidden_layers=4))
    torch.manual_seed(seed + 3)
    text_encoder_2 = tiny_t5(d_model=128, d_kv=16, d_ff=2000, num_layers=4, num_heads=8)
    return {
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "text_encoder_2": text_encoder_2.eval(),
        "scheduler": FlowMatchEulerDiscreteScheduler(**_SCHEDULER_CONFIG),
    }


def _index_entry(library: str, class_name: str, repo: str | None, subfolder: str) -> list[Any]:
    fields = {
        "pretrained_model_name_or_path": repo,
        "subfolder": subfolder,
        "variant": None,
        "revision": None,
        "type_hint": [library, class_name],
    }
    return [library, class_name, fields]


def make_seed_scale_repo(
    folder: str | Path, *, control: bool = False, seed: int = 0, shared_from: str | Path | None = None
) -> Path:
    """Write a Flux repo shaped like FLUX.1-dev (or -Canny-dev, -Depth-dev) at 1/1024 of its size.

    The models weigh what the real ones do with GiB read as MiB: a 22 MiB transformer (two double- and
    five single-stream layers of width 192), an 8.85 MiB T5, a 0.24 MiB CLIP and a 0.17 MiB VAE with three
    levels (64x64 images). Weights are random, float32 safetensors.

    Without ``shared_from`` the folder is a complete classic repo (``model_index.json`` naming
    ``FluxPipeline``, or ``FluxControlPipeline`` with ``control=True``). With ``shared_from`` (a base
    repo written by this function) only ``transformer/`` is written, beside a
    ``modular_model_index.json`` that names the base repo for the text encoders, tokenizers, VAE and
    scheduler and the ``control`` workflow when ``control=True``: pipelines made from both repos
    through one manager share those components by load ID, loaded once.

    Args:
        folder: The repo folder to write (created if missing; existing files are overwritten).
        control: Write a control transformer (it reads the control image's latents too).
        seed: The seed of the random weights; the transformer depends on it alone.
        shared_from: A base repo whose components this one uses, all but the transformer.

    Returns:
        The repo folder as an absolute Path (load IDs name repos as given, so one spelling is kept).
    """
    import json

    import diffusers

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    _seed_scale_transformer(control, seed).save_pretrained(folder / "transformer", safe_serialization=True)
    if shared_from is not None:
        base = str(Path(shared_from).resolve())
        index: dict[str, Any] = {
            "_class_name": "FluxModularPipeline",
            "_blocks_class_name": "FluxAutoBlocks",
            "_diffusers_version": diffusers.__version__,
        }
        if control:
            index["_workflow"] = "control"
        index["transformer"] = _index_entry(*_TRANSFORMER, None, "transformer")
        for name, (library, class_name) in _SHARED_COMPONENTS.items():
            index[name] = _index_entry(library, class_name, base, name)
        (folder / "modular_model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        return folder
    for name, model in _seed_scale_shared_models(seed).items():
        model.save_pretrained(folder / name, **({} if name == "scheduler" else {"safe_serialization": True}))
    make_tiny_clip_tokenizer(folder / "tokenizer")
    make_tiny_t5_tokenizer(folder / "tokenizer_2")
    index = {
        "_class_name": "FluxControlPipeline" if control else "FluxPipeline",
        "_diffusers_version": diffusers.__version__,
        "transformer": list(_TRANSFORMER),
        **{name: list(entry) for name, entry in _SHARED_COMPONENTS.items()},
    }
    if not control:
        index.update(image_encoder=[None, None], feature_extractor=[None, None])
    (folder / "model_index.json").write_text(
        json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return folder


def make_tiny_ip_adapter(folder: str | Path, repo: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random IP-Adapter for the transformer of `repo` into `folder`; returns `folder`.

    ``models/ip-adapter.safetensors`` numbers the double-stream blocks 0, 1, ... (as XLabs' Flux IP-Adapter
    does), beside ``models/image_encoder/``.
    """
    from diffusers import FluxTransformer2DModel

    config = FluxTransformer2DModel.load_config(Path(repo) / "transformer")
    with torch.device("meta"):
        transformer = FluxTransformer2DModel.from_config(config)
    width = transformer.config.joint_attention_dim
    double = [
        name for name in transformer.attn_processors if not name.startswith("single_transformer_blocks")
    ]
    layers = [
        IPAttentionLayer(key=index, hidden_size=transformer.inner_dim, cross_attention_dim=width, bias=True)
        for index in range(len(double))
    ]
    return write_tiny_ip_adapter(folder, layers, width, seed=seed)
