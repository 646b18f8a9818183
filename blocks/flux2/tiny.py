"""Tiny Flux.2 repos for tests and the demo, written offline.

`make_tiny_repo` writes a real diffusers-layout folder (``model_index.json`` naming ``Flux2Pipeline``,
one subfolder per component, safetensors weights, a tokenizer with a Mistral-style chat template) of
tiny random models, saved with the libraries' own ``save_pretrained``, so that loading it runs the same
code as loading a real repo. The sizes follow diffusers' own Flux.2 tests: a transformer of one
double-stream and one single-stream layer (2 heads of 16) with a guidance embedding, a 2-level
AutoencoderKLFlux2 with 4 latent channels (a 32x32 image is 4x16x16 latents, patchified to 16x8x8
and packed into 64 tokens), and a Mistral3ForConditionalGeneration of width 16 with a tiny Pixtral
vision tower. The text model has 30 layers, so the classic default ``text_encoder_out_layers``
(10, 20, 30) reads real layers.

The real FLUX.2-dev tokenizer is a PixtralProcessor, which needs torchvision; the tiny repo saves the
tokenizer alone (a ``PreTrainedTokenizerFast``), whose ``apply_chat_template`` takes the same
arguments for text prompts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from blocks.common.bpe import byte_level_vocab
from blocks.common.tiny import write_variant_weights

__all__ = ["CHAT_TEMPLATE", "LATENT_CHANNELS", "TEXT_LAYERS", "make_tiny_repo", "make_tiny_tokenizer"]

LATENT_CHANNELS = 4
TEXT_LAYERS = 30
_TEXT_WIDTH = 16
_OUT_LAYERS = 3  # the classic pipeline stacks the hidden states of 3 layers

_SPECIALS = (
    "<unk>",
    "[IMG]",
    "<s>",
    "</s>",
    "<pad>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
)
_IMAGE_TOKEN_ID = 1
_BOS_ID, _EOS_ID, _PAD_ID = 2, 3, 4
_WORDS = ("a", "photo", "of", "cat", "dog", "the", "red", "blue", "blurry", "astronaut", "you", "image")
_VOCAB_SIZE = 512  # the text model's embedding rows; the tokenizer uses fewer ids

# A Mistral-style chat template reduced to what the pipeline sends: a system turn and user turns whose
# content is a list of text (or image) parts.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}"
    "{{- '[INST]' }}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- else %}{{- '[IMG]' }}{%- endif %}"
    "{%- endfor %}"
    "{{- '[/INST]' }}"
    "{%- endif %}"
    "{%- endfor %}"
)

# FLUX.2-dev's scheduler config: the classic pipeline computes mu itself (compute_empirical_mu).
_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "time_shift_type": "exponential",
}

_MODEL_FOLDERS = ("transformer", "vae", "text_encoder")


def make_tiny_tokenizer(folder: str | Path):
    """Build a byte-level BPE tokenizer with a Mistral-style chat template, save it, read it back.

    Args:
        folder: where the tokenizer files go (created if missing).

    Returns:
        The ``transformers.PreTrainedTokenizerFast`` read back from `folder`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = byte_level_vocab(_SPECIALS, _WORDS)
    pairs = [(left, right) for left, right in (merge.split(" ") for merge in merges)]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(_SPECIALS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def _text_encoder():
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    config = Mistral3Config(
        text_config={
            "model_type": "mistral",
            "vocab_size": _VOCAB_SIZE,
            "hidden_size": _TEXT_WIDTH,
            "intermediate_size": 24,
            "max_position_embeddings": 512,
            "num_attention_heads": 2,
            "num_hidden_layers": TEXT_LAYERS,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000000.0,
            "sliding_window": None,
            "bos_token_id": _BOS_ID,
            "eos_token_id": _EOS_ID,
            "pad_token_id": _PAD_ID,
        },
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 24,
            "image_size": 32,
            "patch_size": 8,
            "num_channels": 3,
        },
        bos_token_id=_BOS_ID,
        eos_token_id=_EOS_ID,
        pad_token_id=_PAD_ID,
        image_seq_length=4,
        vision_feature_layer=-1,
        image_token_index=_IMAGE_TOKEN_ID,
    )
    return Mistral3ForConditionalGeneration(config).eval()


def _vae(seed: int):
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=4,
        sample_size=32,
    )
    # The batch-norm statistics start at 0 and 1 (no normalization); give them values so the
    # normalization the pipelines apply shows in the results.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape, generator=generator) * 0.1)
        vae.bn.running_var.copy_(torch.rand(vae.bn.running_var.shape, generator=generator) + 0.5)
    return vae.eval()


def _tiny_models(seed: int) -> dict[str, Any]:
    """Build the random models, each from its own seed so that one change leaves the others as they were."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=LATENT_CHANNELS * 4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=_TEXT_WIDTH * _OUT_LAYERS,
        timestep_guidance_channels=256,
        axes_dims_rope=(4, 4, 4, 4),
    )
    vae = _vae(seed + 1)
    torch.manual_seed(seed + 2)
    text_encoder = _text_encoder()
    return {
        "transformer": transformer.eval(),
        "vae": vae,
        "text_encoder": text_encoder,
        "scheduler": FlowMatchEulerDiscreteScheduler(**_SCHEDULER_CONFIG),
    }


def make_tiny_repo(folder: str | Path, variant: str | None = None, *, seed: int = 0) -> Path:
    """Write a tiny random Flux.2 repo in the diffusers layout.

    The folder gets ``model_index.json`` (``Flux2Pipeline``) and ``transformer/``, ``vae/``
    (``AutoencoderKLFlux2``), ``text_encoder/`` (``Mistral3ForConditionalGeneration``), ``tokenizer/``
    and ``scheduler/``. Weights are float32 safetensors. With a `variant`, variant weight files are
    written beside the plain ones, holding the weights in the variant's dtype (float16 for ``"fp16"``,
    bfloat16 for ``"bf16"``, float32 otherwise), as hub repos do. The same arguments always write the
    same weights.

    Args:
        folder: the repo folder to write (created if missing; existing files are overwritten).
        variant: an optional weights variant name such as ``"bf16"``.
        seed: the seed of the random weights.

    Returns:
        The repo folder as a Path.
    """
    from diffusers import Flux2Pipeline

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = _tiny_models(seed)
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = make_tiny_tokenizer(tok_dir)
    Flux2Pipeline(**models, tokenizer=tokenizer).save_pretrained(folder, safe_serialization=True)
    if variant is not None:
        write_variant_weights(folder, models, _MODEL_FOLDERS, variant)
    return folder
