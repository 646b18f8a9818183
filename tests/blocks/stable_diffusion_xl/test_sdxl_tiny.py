"""The tiny SDXL repo builder writes repos that diffusers' classic SDXL pipelines load and run."""

import json

import torch
from diffusers import (
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLInpaintPipeline,
    StableDiffusionXLPipeline,
)
from safetensors.torch import load_file

from blocks.stable_diffusion_xl.tiny import make_tiny_repo

from .. import helpers


def test_classic_pipeline_loads_and_runs(sdxl_repo):
    """StableDiffusionXLPipeline.from_pretrained loads the tiny repo and makes a 64x64 image in 2 steps."""
    index = json.loads((sdxl_repo / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline"
    assert index["force_zeros_for_empty_prompt"] is True
    assert index["scheduler"] == ["diffusers", "EulerDiscreteScheduler"]
    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_repo, add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.unet.config.addition_embed_type == "text_time"
    assert pipe.vae.config.force_upcast and pipe.vae.dtype == torch.float32
    for name in ("tokenizer", "tokenizer_2"):
        assert (sdxl_repo / name / "vocab.json").is_file() and (sdxl_repo / name / "merges.txt").is_file()
    images = pipe("a photo of a cat", num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 64, 64, 3)


def test_refiner_repo_runs_in_classic_img2img(sdxl_refiner_repo):
    """refiner=True writes an img2img repo without text_encoder that the classic img2img pipeline runs."""
    index = json.loads((sdxl_refiner_repo / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLImg2ImgPipeline"
    assert index["text_encoder"] == [None, None] and index["tokenizer"] == [None, None]
    assert index["requires_aesthetics_score"] is True
    pipe = StableDiffusionXLImg2ImgPipeline.from_pretrained(sdxl_refiner_repo, add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    image = torch.rand(1, 3, 64, 64)
    out = pipe("a cat", image=image, num_inference_steps=4, strength=0.5, output_type="np").images
    assert out.shape == (1, 64, 64, 3)


def test_inpainting_repo_runs_in_classic_inpaint(sdxl_inpaint_repo):
    """inpainting=True writes a 9-channel UNet that the classic SDXL inpainting pipeline runs."""
    pipe = StableDiffusionXLInpaintPipeline.from_pretrained(sdxl_inpaint_repo, add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.unet.config.in_channels == 9
    mask = torch.zeros(1, 1, 64, 64)
    mask[..., 16:48, 16:48] = 1.0
    image = torch.rand(1, 3, 64, 64)
    out = pipe("a cat", image=image, mask_image=mask, num_inference_steps=2, output_type="np").images
    assert out.shape == (1, 64, 64, 3)


def test_same_seed_same_weights_and_variants(tmp_path):
    """The same seed writes identical weights, another seed other ones; variant='fp16' adds float16 files."""
    weights = "unet/diffusion_pytorch_model.safetensors"
    helpers.assert_seed_decides_weights(make_tiny_repo, tmp_path, weights, variant="fp16")
    for name, stem in [("unet", "diffusion_pytorch_model"), ("text_encoder_2", "model")]:
        half = load_file(tmp_path / "a" / name / f"{stem}.fp16.safetensors")
        assert {t.dtype for t in half.values()} == {torch.float16}
