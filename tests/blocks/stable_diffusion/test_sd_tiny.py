"""The tiny Stable Diffusion repo builder writes a repo diffusers itself loads and runs."""

import json

import torch
from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline

from blocks.stable_diffusion.tiny import make_tiny_repo

from .. import helpers


def test_classic_pipeline_loads_and_runs(tmp_path):
    """StableDiffusionPipeline.from_pretrained loads the tiny repo and makes a 64x64 image in 2 steps."""
    repo = make_tiny_repo(tmp_path / "sd")
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    assert index["safety_checker"] == [None, None]
    pipe = StableDiffusionPipeline.from_pretrained(repo)
    pipe.set_progress_bar_config(disable=True)
    images = pipe("a photo of a cat", num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 64, 64, 3)


def test_same_arguments_write_same_weights(tmp_path):
    """Two repos built with the same seed hold identical weights; another seed changes them."""
    helpers.assert_seed_decides_weights(make_tiny_repo, tmp_path, "unet/diffusion_pytorch_model.safetensors")


def test_variant_files_hold_variant_dtype(tmp_path):
    """With variant='fp16' each model folder also holds a float16 `.fp16.safetensors` file."""
    repo = make_tiny_repo(tmp_path / "sd", variant="fp16")
    folders = [
        ("unet", "diffusion_pytorch_model"),
        ("vae", "diffusion_pytorch_model"),
        ("text_encoder", "model"),
    ]
    helpers.assert_variant_files(repo, "fp16", torch.float16, folders)


def test_tokenizer_files_written_offline(tmp_path):
    """The tokenizer folder holds vocab.json and merges.txt, and whole words map to single tokens."""
    repo = make_tiny_repo(tmp_path / "sd")
    pipe = StableDiffusionPipeline.from_pretrained(repo)
    assert (repo / "tokenizer" / "vocab.json").is_file()
    assert (repo / "tokenizer" / "merges.txt").is_file()
    ids = pipe.tokenizer("a photo of a cat").input_ids
    assert len(ids) == 7  # bos, five words, eos
    assert max(ids) < pipe.text_encoder.config.vocab_size


def test_inpainting_repo(tmp_path):
    """inpainting=True writes a 9-channel UNet that the classic inpainting pipeline runs."""
    repo = make_tiny_repo(tmp_path / "inpaint", inpainting=True)
    pipe = StableDiffusionInpaintPipeline.from_pretrained(repo)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.unet.config.in_channels == 9
    image = torch.rand(1, 3, 64, 64)
    mask = torch.zeros(1, 1, 64, 64)
    mask[..., 16:48, 16:48] = 1.0
    out = pipe("a cat", image=image, mask_image=mask, num_inference_steps=2, output_type="np").images
    assert out.shape == (1, 64, 64, 3)
