"""Shared fixtures for the SDXL tests: tiny repos, our pipelines and the classic ones on the same objects."""

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

from ..helpers import ParityHarness

# Until the entry point is in pyproject.toml; harmless once it is.
modular.register_family(FAMILY)

SDXL = ParityHarness(
    blocks_class=StableDiffusionXLAutoBlocks,
    make_tiny_repo=make_tiny_repo,
    classic={
        "text2image": StableDiffusionXLPipeline,
        "image2image": StableDiffusionXLImg2ImgPipeline,
        "inpainting": StableDiffusionXLInpaintPipeline,
    },
    components=("vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "scheduler"),
    classic_options={"add_watermarker": False},
)
COMPONENTS = SDXL.components
classic_from, run_both = SDXL.classic_from, SDXL.run_both

sdxl_repo = SDXL.repo_fixture("tiny-sdxl", "A tiny SDXL base repo.")
sdxl_refiner_repo = SDXL.repo_fixture(
    "tiny-sdxl-refiner",
    "A tiny refiner-style SDXL repo (text_encoder_2 only, aesthetic scores).",
    refiner=True,
)
sdxl_inpaint_repo = SDXL.repo_fixture(
    "tiny-sdxl-inpaint", "A tiny SDXL inpainting repo with a 9-channel UNet.", inpainting=True
)
sdxl_pipe = SDXL.pipe_fixture("sdxl_repo")
sdxl_inpaint_pipe = SDXL.pipe_fixture("sdxl_inpaint_repo")
sdxl_refiner_pipe = SDXL.pipe_fixture("sdxl_refiner_repo", StableDiffusionXLRefinerBlocks)
