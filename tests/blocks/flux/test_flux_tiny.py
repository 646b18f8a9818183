"""The tiny Flux repo builder writes repos diffusers itself loads and runs."""

import json

import torch
from diffusers import FluxControlPipeline, FluxPipeline

from blocks.flux.tiny import make_tiny_repo

from .. import helpers

WEIGHTS = "diffusion_pytorch_model.safetensors"


def test_classic_pipeline_loads_and_runs(tmp_path):
    """FluxPipeline.from_pretrained loads the tiny repo and makes a 32x32 image in 2 steps."""
    repo = make_tiny_repo(tmp_path / "flux")
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == "FluxPipeline"
    assert index["text_encoder_2"] == ["transformers", "T5EncoderModel"]
    pipe = FluxPipeline.from_pretrained(repo)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer.config.guidance_embeds
    images = pipe("a photo of a cat", height=32, width=32, num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 32, 32, 3)


def test_control_repo(tmp_path):
    """control=True doubles the transformer's input channels; FluxControlPipeline loads and runs it."""
    repo = make_tiny_repo(tmp_path / "control", control=True)
    assert json.loads((repo / "model_index.json").read_text())["_class_name"] == "FluxControlPipeline"
    pipe = FluxControlPipeline.from_pretrained(repo)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer.config.in_channels == 2 * 4 * pipe.vae.config.latent_channels
    assert pipe.transformer.config.out_channels == 4 * pipe.vae.config.latent_channels
    control_image = torch.rand(1, 3, 32, 32)
    out = pipe(
        "a cat", control_image=control_image, height=32, width=32, num_inference_steps=2, output_type="np"
    )
    assert out.images.shape == (1, 32, 32, 3)


def test_same_arguments_write_same_weights(tmp_path):
    """Two repos built with the same seed hold identical weights; another seed changes them."""
    helpers.assert_seed_decides_weights(make_tiny_repo, tmp_path, f"transformer/{WEIGHTS}")


def test_variant_files_hold_variant_dtype(tmp_path):
    """With variant='bf16' each model folder also holds a bfloat16 `.bf16.safetensors` file."""
    repo = make_tiny_repo(tmp_path / "flux", variant="bf16")
    folders = [(name, "diffusion_pytorch_model") for name in ("transformer", "vae")]
    folders += [(name, "model") for name in ("text_encoder", "text_encoder_2")]
    helpers.assert_variant_files(repo, "bf16", torch.bfloat16, folders)


def test_tokenizers_know_whole_words(tmp_path):
    """Both tokenizers are written offline and map whole words to single tokens within the vocab sizes."""
    pipe = FluxPipeline.from_pretrained(make_tiny_repo(tmp_path / "flux"))
    clip_ids = pipe.tokenizer("a photo of a cat").input_ids
    t5_ids = pipe.tokenizer_2("a photo of a cat").input_ids
    assert len(clip_ids) == 7  # bos, five words, eos
    assert len(t5_ids) == 6  # five words, eos
    assert max(clip_ids) < pipe.text_encoder.config.vocab_size
    assert max(t5_ids) < pipe.text_encoder_2.config.vocab_size
