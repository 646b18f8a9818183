"""Shared fixtures for the block-family tests: tiny repos, our pipelines and the classic ones."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import (
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
)

from blocks.stable_diffusion import StableDiffusionAutoBlocks, make_tiny_repo

CLASSIC = {
    "text2image": StableDiffusionPipeline,
    "image2image": StableDiffusionImg2ImgPipeline,
    "inpainting": StableDiffusionInpaintPipeline,
}


@pytest.fixture(scope="session")
def sd_repo(tmp_path_factory):
    """A tiny SD repo with a 4-channel UNet."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-sd")


@pytest.fixture(scope="session")
def sd_inpaint_repo(tmp_path_factory):
    """A tiny SD inpainting repo with a 9-channel UNet."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-sd-inpaint", inpainting=True)


@pytest.fixture(scope="session")
def sd_vae4_repo(tmp_path_factory):
    """A tiny SD repo whose VAE has 3 levels: 4 pixels per latent cell."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-sd-vae4", vae_levels=3)


def load_pipeline(repo):
    """Our SD pipeline on `repo`, every component loaded in float32, progress bars off."""
    pipe = StableDiffusionAutoBlocks().init_pipeline(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def classic_from(pipe, workflow):
    """The classic diffusers pipeline for `workflow`, built on the very component objects of `pipe`."""
    classic = CLASSIC[workflow](
        vae=pipe.vae,
        text_encoder=pipe.text_encoder,
        tokenizer=pipe.tokenizer,
        unet=pipe.unet,
        scheduler=pipe.scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    classic.set_progress_bar_config(disable=True)
    return classic


@pytest.fixture(scope="session")
def sd_pipe(sd_repo):
    return load_pipeline(sd_repo)


@pytest.fixture(scope="session")
def sd_inpaint_pipe(sd_inpaint_repo):
    return load_pipeline(sd_inpaint_repo)


@pytest.fixture(scope="session")
def sd_vae4_pipe(sd_vae4_repo):
    return load_pipeline(sd_vae4_repo)


def make_image(seed=0, size=64, height=None):
    """A random RGB PIL image, `size` wide and `height` (default `size`) high, the same for the same seed."""
    shape = (size if height is None else height, size, 3)
    pixels = np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def make_mask(size=64, height=None):
    """A black L-mode mask with a white rectangle in the middle (white is repainted)."""
    height = size if height is None else height
    mask = np.zeros((height, size), dtype=np.uint8)
    mask[height // 4 : 3 * height // 4, size // 4 : 3 * size // 4] = 255
    return PIL.Image.fromarray(mask)  # 2-D uint8: mode "L"
