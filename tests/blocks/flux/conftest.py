"""Shared fixtures for the Flux tests: tiny repos, our pipelines and the classic ones on the same objects."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import FluxControlPipeline, FluxImg2ImgPipeline, FluxPipeline

from blocks.flux import FAMILY, FluxAutoBlocks, make_tiny_repo
from modular import register_family

# Harmless once the entry point names the family.
register_family(FAMILY)

CLASSIC = {"text2image": FluxPipeline, "image2image": FluxImg2ImgPipeline, "control": FluxControlPipeline}
COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler")


@pytest.fixture(scope="session")
def flux_repo(tmp_path_factory):
    """A tiny Flux repo (FluxPipeline, guidance-embedding transformer)."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-flux")


@pytest.fixture(scope="session")
def flux_control_repo(tmp_path_factory):
    """A tiny Flux control repo (FluxControlPipeline, transformer with doubled input channels)."""
    return make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-flux-control", control=True)


def load_pipeline(repo):
    """Our Flux pipeline on `repo`, every component loaded in float32, progress bars off."""
    pipe = FluxAutoBlocks().init_pipeline(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def classic_from(pipe, workflow):
    """The classic diffusers pipeline for `workflow`, built on the very component objects of `pipe`."""
    classic = CLASSIC[workflow](**{name: getattr(pipe, name) for name in COMPONENTS})
    classic.set_progress_bar_config(disable=True)
    return classic


@pytest.fixture(scope="session")
def flux_pipe(flux_repo):
    return load_pipeline(flux_repo)


@pytest.fixture(scope="session")
def flux_control_pipe(flux_control_repo):
    return load_pipeline(flux_control_repo)


def make_image(seed=0, size=32):
    """A random RGB PIL image, the same for the same seed."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)
