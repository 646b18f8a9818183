"""The tiny Z-Image repo builder writes a repo diffusers itself loads and runs."""

import json

import torch
from diffusers import ZImagePipeline

from blocks.z_image.tiny import make_tiny_repo

from .. import helpers


def test_classic_pipeline_loads_and_runs(zimage_repo):
    """ZImagePipeline.from_pretrained loads the tiny repo and makes a 32x32 image in 2 steps."""
    index = json.loads((zimage_repo / "model_index.json").read_text())
    assert index["_class_name"] == "ZImagePipeline"
    assert index["tokenizer"] == ["transformers", "Qwen2Tokenizer"]
    assert index["text_encoder"] == ["transformers", "Qwen3Model"]
    pipe = ZImagePipeline.from_pretrained(zimage_repo)
    pipe.set_progress_bar_config(disable=True)
    images = pipe("a photo of a cat", height=32, width=32, num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 32, 32, 3)


def test_tokenizer_chat_template_and_words(zimage_repo):
    """The tokenizer applies a Qwen-style chat template, and whole words map to single tokens."""
    tokenizer = ZImagePipeline.from_pretrained(zimage_repo).tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a cat"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert text == "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n"
    no_thinking = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a cat"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert no_thinking == text + "<think>\n\n</think>\n\n"
    ids = tokenizer("<|im_start|>user a photo of a cat").input_ids
    assert len(ids) == 7  # <|im_start|>, user, and five words
    assert tokenizer.convert_ids_to_tokens(ids[0]) == "<|im_start|>"
    padded = tokenizer("a cat", padding="max_length", max_length=8)
    assert padded.attention_mask == [1, 1, 0, 0, 0, 0, 0, 0]


def test_same_arguments_write_same_weights(tmp_path):
    """Two repos built with the same seed hold identical weights; another seed changes them."""
    helpers.assert_seed_decides_weights(
        make_tiny_repo, tmp_path, "transformer/diffusion_pytorch_model.safetensors"
    )


def test_variant_files_hold_variant_dtype(tmp_path):
    """With variant='bf16' each model folder also holds a bfloat16 `.bf16.safetensors` file."""
    repo = make_tiny_repo(tmp_path / "z", variant="bf16")
    folders = [(name, "diffusion_pytorch_model") for name in ("transformer", "vae")] + [
        ("text_encoder", "model")
    ]
    helpers.assert_variant_files(repo, "bf16", torch.bfloat16, folders)
