"""Shared fixtures for the Z-Image tests: a tiny repo, our pipeline and the classic ones on its components."""

from diffusers import ZImageImg2ImgPipeline, ZImagePipeline

import modular
from blocks.z_image import FAMILY, ZImageAutoBlocks, make_tiny_repo

from .. import helpers
from ..helpers import ParityHarness

# Until the lead adds the entry point to pyproject.toml; harmless once it exists.
modular.register_family(FAMILY)

SIZE = 32  # pixels; 16x16 latents, 8x8 transformer patches
Z_IMAGE = ParityHarness(
    blocks_class=ZImageAutoBlocks,
    make_tiny_repo=make_tiny_repo,
    classic={"text2image": ZImagePipeline, "image2image": ZImageImg2ImgPipeline},
    components=("transformer", "vae", "text_encoder", "tokenizer", "scheduler"),
)
COMPONENTS = Z_IMAGE.components
classic_from, run_both = Z_IMAGE.classic_from, Z_IMAGE.run_both

zimage_repo = Z_IMAGE.repo_fixture("tiny-z-image", "A tiny Z-Image repo.")
zimage_pipe = Z_IMAGE.pipe_fixture("zimage_repo")


def make_image(seed=0, size=SIZE):
    """A random RGB PIL image, the same for the same seed."""
    return helpers.make_image(seed, size)
