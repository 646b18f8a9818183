"""Shared fixtures for the Flux.2 tests: a tiny repo, our pipeline and the classic one on its components."""

from diffusers import Flux2Pipeline

import modular
from blocks.flux2 import FAMILY, Flux2AutoBlocks, make_tiny_repo

from .. import helpers
from ..helpers import ParityHarness

# Until the lead adds the entry point to pyproject.toml; harmless once it exists.
modular.register_family(FAMILY)

SIZE = 32  # pixels; 4x16x16 VAE latents, patchified to 16x8x8, packed into 64 tokens
REFERENCE_SIZE = 64  # the classic pipeline's smallest reference image side
FLUX2 = ParityHarness(
    blocks_class=Flux2AutoBlocks,
    make_tiny_repo=make_tiny_repo,
    classic={"text2image": Flux2Pipeline, "image_conditioned": Flux2Pipeline},
    components=("transformer", "vae", "text_encoder", "tokenizer", "scheduler"),
)
COMPONENTS = FLUX2.components
classic_from, run_both = FLUX2.classic_from, FLUX2.run_both

flux2_repo = FLUX2.repo_fixture("tiny-flux2", "A tiny Flux.2 repo.")
flux2_pipe = FLUX2.pipe_fixture("flux2_repo")


def make_image(seed=0, size=REFERENCE_SIZE, height=None):
    """A random RGB PIL reference image, the same for the same seed."""
    return helpers.make_image(seed, size, height)
