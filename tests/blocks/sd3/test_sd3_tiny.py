"""The tiny SD3 repo builder writes repos diffusers itself loads and runs."""

import json

import torch
from diffusers import StableDiffusion3InpaintPipeline, StableDiffusion3Pipeline

from blocks.sd3.tiny import make_tiny_repo

from .. import helpers
from .conftest import make_image, make_mask


def test_classic_pipeline_loads_and_runs(sd3_repo):
    """StableDiffusion3Pipeline.from_pretrained loads the tiny repo and makes a 32x32 image in 2 steps."""
    index = json.loads((sd3_repo / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusion3Pipeline"
    assert index["text_encoder_3"] == ["transformers", "T5EncoderModel"]
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_repo)
    pipe.set_progress_bar_config(disable=True)
    images = pipe("a photo of a cat", num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 32, 32, 3)


def test_inpainting_repo_and_repo_without_t5(sd3_inpaint_repo, sd3_no_t5_repo):
    """The inpainting repo's transformer reads 33 channels and its pipeline runs; the repo without T5 has none."""
    pipe = StableDiffusion3InpaintPipeline.from_pretrained(sd3_inpaint_repo)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer.config.in_channels == 33
    images = pipe(
        "a cat", image=make_image(), mask_image=make_mask(), num_inference_steps=2, output_type="np"
    )
    assert images.images.shape == (1, 32, 32, 3)
    index = json.loads((sd3_no_t5_repo / "model_index.json").read_text())
    assert index["text_encoder_3"] == [None, None]
    assert index["tokenizer_3"] == [None, None]
    assert not (sd3_no_t5_repo / "text_encoder_3").exists()


def test_tokenizers_split_words(sd3_repo):
    """Both CLIP tokenizers and the T5 one map the tiny vocabulary's words to single tokens."""
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_repo)
    for tokenizer in (pipe.tokenizer, pipe.tokenizer_2):
        assert len(tokenizer("a photo of a cat").input_ids) == 7  # start, five words, end
    assert len(pipe.tokenizer_3("a photo of a cat").input_ids) == 6  # five words, </s>


def test_same_arguments_write_same_weights(tmp_path):
    """Two repos built with the same seed hold identical weights; another seed changes them."""
    helpers.assert_seed_decides_weights(
        make_tiny_repo, tmp_path, "transformer/diffusion_pytorch_model.safetensors"
    )


def test_variant_files_hold_variant_dtype(tmp_path):
    """With variant='fp16' each model folder also holds a float16 `.fp16.safetensors` file."""
    repo = make_tiny_repo(tmp_path / "sd3", variant="fp16")
    folders = [(name, "diffusion_pytorch_model") for name in ("transformer", "vae")] + [
        (name, "model") for name in ("text_encoder", "text_encoder_2", "text_encoder_3")
    ]
    helpers.assert_variant_files(repo, "fp16", torch.float16, folders)
