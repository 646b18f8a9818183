"""Shared fixtures for the SD3 tests: tiny repos, our pipelines and the classic ones on the same objects."""

from diffusers import (
    StableDiffusion3Img2ImgPipeline,
    StableDiffusion3InpaintPipeline,
    StableDiffusion3Pipeline,
)

import modular
from blocks.sd3 import FAMILY, SD3AutoBlocks, make_tiny_repo

from .. import helpers
from ..helpers import ParityHarness

# Until the lead adds the entry point to pyproject.toml; harmless once it exists.
modular.register_family(FAMILY)

SIZE = 32  # pixels: 16x16 latents, 8x8 transformer patches (the tiny transformer's sample size)
SD3 = ParityHarness(
    blocks_class=SD3AutoBlocks,
    make_tiny_repo=make_tiny_repo,
    classic={
        "text2image": StableDiffusion3Pipeline,
        "image2image": StableDiffusion3Img2ImgPipeline,
        "inpainting": StableDiffusion3InpaintPipeline,
    },
    components=(
        "transformer",
        "vae",
        "text_encoder",
        "tokenizer",
        "text_encoder_2",
        "tokenizer_2",
        "text_encoder_3",
        "tokenizer_3",
        "scheduler",
    ),
)
COMPONENTS = SD3.components
classic_from, run_both = SD3.classic_from, SD3.run_both

sd3_repo = SD3.repo_fixture("tiny-sd3", "A tiny SD3 repo (StableDiffusion3Pipeline, with T5).")
sd3_inpaint_repo = SD3.repo_fixture(
    "tiny-sd3-inpaint", "A tiny SD3 inpainting repo (33-channel transformer).", inpaint=True
)
sd3_no_t5_repo = SD3.repo_fixture(
    "tiny-sd3-no-t5", "A tiny SD3 repo without T5 (text_encoder_3 null).", t5=False
)
sd3_pipe = SD3.pipe_fixture("sd3_repo")
sd3_inpaint_pipe = SD3.pipe_fixture("sd3_inpaint_repo")


def make_image(seed=0, size=SIZE):
    """A random RGB PIL image, the same for the same seed."""
    return helpers.make_image(seed, size)


def make_mask(size=SIZE):
    """A mask with a white (repainted) square in the middle."""
    return helpers.make_mask(size)
