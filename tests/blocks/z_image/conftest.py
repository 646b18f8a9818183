"""Shared fixtures for the Z-Image tests: a tiny repo, our pipeline and the classic ones on its components."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import ZImageImg2ImgPipeline, ZImagePipeline

import modular
from blocks.z_image import FAMILY, ZImageAutoBlocks, make_tiny_repo

# Until the lead adds the entry point to pyproject.toml; harmless once it exists.
modular.register_family(FAMILY)

CLASSIC = {"text2image": ZImagePipeline, "image2image": ZImageImg2ImgPipeline}
COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
SIZE = 32  # pixels; 16x16 latents, 8x8 transformer patches


@pytest.fixture(scope="session")
def zimage_repo(tmp_path_factory):
    """A tiny Z-Image repo."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-z-image")


def load_pipeline(repo):
    """Our Z-Image pipeline on `repo`, every component loaded in float32, progress bars off."""
    pipe = ZImageAutoBlocks().init_pipeline(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def zimage_pipe(zimage_repo):
    return load_pipeline(zimage_repo)


def classic_from(pipe, workflow):
    """The classic diffusers pipeline for `workflow`, built on the very component objects of `pipe`."""
    classic = CLASSIC[workflow](**{name: getattr(pipe, name) for name in COMPONENTS})
    classic.set_progress_bar_config(disable=True)
    return classic


def make_image(seed=0, size=SIZE):
    """A random RGB PIL image, the same for the same seed."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)
