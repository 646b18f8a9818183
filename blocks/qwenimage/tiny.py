"""Tiny Qwen-Image repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json`` naming ``QwenImagePipeline``,
one subfolder per component, safetensors weights, a byte-level Qwen2 tokenizer) of tiny random models,
saved with the libraries' own ``save_pretrained``, so that loading it runs the same code as loading a
real repo; `make_tiny_edit_repo` writes a ``QwenImageEditPipeline`` repo of the same models plus a
``Qwen2VLProcessor``. The sizes follow diffusers' own Qwen-Image fast tests: a 2-layer
QwenImageTransformer2DModel (3 heads of 16), a 2-layer Qwen2.5-VL of width 16 with a 2-layer vision
tower, and a 3D causal VAE of 4 latent channels, 8 pixels per latent cell as the real one has.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from blocks.common.qwen2_tokenizer import make_trained_qwen2_tokenizer
from blocks.common.tiny import write_variant_weights

__all__ = [
    "LATENT_CHANNELS",
    "make_tiny_edit_repo",
    "make_tiny_processor",
    "make_tiny_repo",
    "make_tiny_tokenizer",
]

LATENT_CHANNELS = 4  # the real VAE has 16
_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Words the tokenizer learns whole, besides those of the pipelines' system prompts: so that, as with the real
# tokenizer, the text-to-image template's prefix is the 34 tokens the pipeline drops.
_WORDS = (
    *("user", "assistant", "system", "a", "photo", "of", "cat", "dog", "the", "red", "blue", "blurry"),
    *("astronaut", "hat", "make", "it", "green", "on", "hill"),
)
_VOCAB_SIZE = 1024  # the text model's embedding rows; the tokenizer uses fewer ids

# Qwen-Image's scheduler: flow matching shifted by the image's sequence length (exponential time shift).
_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}
_MODEL_FOLDERS = ("transformer", "vae", "text_encoder")
# The vision tower reads 14-pixel patches, merged 2x2; the processor resizes an image to 56..112 pixels a side.
_MIN_PIXELS, _MAX_PIXELS = 56 * 56, 112 * 112


def make_tiny_tokenizer(folder: str | Path):
    """Write the tiny Qwen2 tokenizer into `folder` and read it back: byte-level BPE whose merges are learned
    from the pipelines' system prompts and a few prompt words (specials first: ids 0..6).

    Args:
        folder: where the tokenizer files go (created if missing).

    Returns:
        The ``transformers.Qwen2Tokenizer``.
    """
    from .encoders import EDIT_TEMPLATE, TEXT2IMAGE_TEMPLATE

    corpus = [TEXT2IMAGE_TEMPLATE.format(""), EDIT_TEMPLATE.format(""), " ".join(_WORDS)] * 3
    return make_trained_qwen2_tokenizer(folder, _SPECIALS, corpus, model_max_length=2048)


@functools.cache
def _image_text_processor_class() -> type:
    """``Qwen2VLProcessor`` for images and text only.

    transformers builds Qwen2-VL's video processor only with torchvision, which this project does not install,
    and ``Qwen2VLProcessor`` will not be made without one; the edit pipelines never pass videos. This subclass
    takes the image processor and the tokenizer alone and processes images and text exactly as its parent.
    """
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageTextQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = "<|image_pad|>"
            self.video_token = "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    return ImageTextQwen2VLProcessor


def make_tiny_processor(tokenizer: Any):
    """The edit repo's processor: `tokenizer` and an image processor for the tiny vision tower (a
    ``Qwen2VLProcessor``; without torchvision, its image-and-text subclass, see ``load_tiny_processor``)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(min_pixels=_MIN_PIXELS, max_pixels=_MAX_PIXELS)
    return _processor_class()(image_processor=image_processor, tokenizer=tokenizer)


def _processor_class() -> Any:
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        from transformers import Qwen2VLProcessor

        return Qwen2VLProcessor
    return _image_text_processor_class()


def load_tiny_processor(repo: str | Path):
    """The edit repo's processor, read from ``repo/processor``: a ``Qwen2VLProcessor`` where torchvision is
    installed (it loads as the index names it), else ``Qwen2VLProcessor``'s image-and-text subclass, which
    loads the same files without a video processor."""
    return _processor_class().from_pretrained(Path(repo) / "processor")


def _text_encoder(tokenizer: Any):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "vocab_size": _VOCAB_SIZE,
            "max_position_embeddings": 2048,
            "rope_theta": 1000000.0,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "pad_token_id": ids("<|endoftext|>"),
            "bos_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|im_end|>"),
        },
        vision_config={
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": 16,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def _tiny_models(seed: int, tokenizer: Any) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=LATENT_CHANNELS * 4,
        out_channels=LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(seed + 1)
    # Three down levels (8 pixels per latent cell); the latent statistics are not the identity, so that
    # the normalization shows in the results.
    generator = torch.Generator().manual_seed(seed + 1)
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[
            round(x, 4) for x in (torch.randn(LATENT_CHANNELS, generator=generator) * 0.5).tolist()
        ],
        latents_std=[round(x, 4) for x in (torch.rand(LATENT_CHANNELS, generator=generator) + 0.5).tolist()],
    )
    torch.manual_seed(seed + 2)
    text_encoder = _text_encoder(tokenizer)
    return {
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "text_encoder": text_encoder,
        "scheduler": FlowMatchEulerDiscreteScheduler(**_SCHEDULER_CONFIG),
    }


def _write(folder: str | Path, variant: str | None, seed: int, edit: bool) -> Path:
    from diffusers import QwenImageEditPipeline, QwenImagePipeline

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = make_tiny_tokenizer(tok_dir)
    models = _tiny_models(seed, tokenizer)
    if edit:
        pipe = QwenImageEditPipeline(**models, tokenizer=tokenizer, processor=make_tiny_processor(tokenizer))
    else:
        pipe = QwenImagePipeline(**models, tokenizer=tokenizer)
    pipe.save_pretrained(folder, safe_serialization=True)
    if edit:
        _name_the_real_processor(folder)
    if variant is not None:
        write_variant_weights(folder, models, _MODEL_FOLDERS, variant)
    return folder


def _name_the_real_processor(folder: Path) -> None:
    """The index and processor files name ``Qwen2VLProcessor``, as a real edit repo's do (they were saved by its
    image-and-text subclass where torchvision is missing)."""
    for path, keys in (
        (folder / "model_index.json", ("processor",)),
        (folder / "processor" / "processor_config.json", ()),
        (folder / "processor" / "tokenizer_config.json", ()),
    ):
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for key in keys:
            data[key] = ["transformers", "Qwen2VLProcessor"]
        if "processor_class" in data:
            data["processor_class"] = "Qwen2VLProcessor"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def make_tiny_repo(folder: str | Path, variant: str | None = None, *, seed: int = 0) -> Path:
    """Write a tiny random Qwen-Image (text-to-image) repo in the diffusers layout.

    The folder gets ``model_index.json`` (``QwenImagePipeline``) and ``transformer/``, ``vae/``
    (``AutoencoderKLQwenImage``), ``text_encoder/`` (``Qwen2_5_VLForConditionalGeneration``),
    ``tokenizer/`` (``Qwen2Tokenizer``) and ``scheduler/`` (``FlowMatchEulerDiscreteScheduler`` with
    dynamic shifting). Weights are float32 safetensors. With a `variant`, variant weight files are
    written beside the plain ones in the variant's dtype (float16 for ``"fp16"``, bfloat16 for
    ``"bf16"``, float32 otherwise), as hub repos do. The same arguments always write the same weights.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"bf16"``.
        seed: the seed of the random weights.

    Returns:
        The repo folder as a Path.
    """
    return _write(folder, variant, seed, edit=False)


def make_tiny_edit_repo(folder: str | Path, variant: str | None = None, *, seed: int = 0) -> Path:
    """Write a tiny random Qwen-Image-Edit repo: `make_tiny_repo`'s models (same seed, same weights) under
    ``model_index.json`` naming ``QwenImageEditPipeline``, plus ``processor/`` (a ``Qwen2VLProcessor``: the
    tokenizer and an image processor that resizes to 56..112 pixels a side for the tiny vision tower).

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"bf16"``.
        seed: the seed of the random weights.

    Returns:
        The repo folder as a Path.
    """
    return _write(folder, variant, seed, edit=True)
