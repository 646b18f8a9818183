"""Shared fixtures for the SDXL tests: tiny repos, our pipelines and the classic ones on the same objects."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import (
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLInpaintPipeline,
    StableDiffusionXLPipeline,
)

import modular
from blocks.stable_diffusion_xl import (
    FAMILY,
    StableDiffusionXLAutoBlocks,
    StableDiffusionXLRefinerBlocks,
    make_tiny_repo,
)

# Until the entry point is in pyproject.toml; harmless once it is.
modular.register_family(FAMILY)

CLASSIC = {
    "text2image": StableDiffusionXLPipeline,
    "image2image": StableDiffusionXLImg2ImgPipeline,
    "inpainting": StableDiffusionXLInpaintPipeline,
}
COMPONENTS = ("vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "scheduler")


@pytest.fixture(scope="session")
def sdxl_repo(tmp_path_factory):
    """A tiny SDXL base repo."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-sdxl")


@pytest.fixture(scope="session")
def sdxl_refiner_repo(tmp_path_factory):
    """A tiny refiner-style SDXL repo (text_encoder_2 only, aesthetic scores)."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-sdxl-refiner", refiner=True)


@pytest.fixture(scope="session")
def sdxl_inpaint_repo(tmp_path_factory):
    """A tiny SDXL inpainting repo with a 9-channel UNet."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-sdxl-inpaint", inpainting=True)


def load_pipeline(repo, blocks_class=StableDiffusionXLAutoBlocks):
    """Our SDXL pipeline on `repo`, every component loaded in float32, progress bars off."""
    pipe = blocks_class().init_pipeline(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def classic_from(pipe, workflow, **config):
    """The classic diffusers pipeline for `workflow`, built on the very component objects of `pipe`."""
    components = {name: pipe.components.get(name) for name in COMPONENTS}
    classic = CLASSIC[workflow](**components, add_watermarker=False, **config)
    classic.set_progress_bar_config(disable=True)
    return classic


@pytest.fixture(scope="session")
def sdxl_pipe(sdxl_repo):
    return load_pipeline(sdxl_repo)


@pytest.fixture(scope="session")
def sdxl_inpaint_pipe(sdxl_inpaint_repo):
    return load_pipeline(sdxl_inpaint_repo)


@pytest.fixture(scope="session")
def sdxl_refiner_pipe(sdxl_refiner_repo):
    return load_pipeline(sdxl_refiner_repo, StableDiffusionXLRefinerBlocks)


def make_image(seed=0, size=64):
    """A random RGB PIL image, the same for the same seed."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def make_mask(size=64):
    """A black L-mode mask with a white square in the middle (white is repainted)."""
    mask = np.zeros((size, size), dtype=np.uint8)
    mask[size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 255
    return PIL.Image.fromarray(mask)
