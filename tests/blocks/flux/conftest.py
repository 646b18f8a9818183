"""Shared fixtures for the Flux tests: tiny repos, our pipelines and the classic ones on the same objects."""

from diffusers import FluxControlPipeline, FluxImg2ImgPipeline, FluxPipeline

from blocks.flux import FAMILY, FluxAutoBlocks, make_tiny_repo
from modular import register_family

from .. import helpers
from ..helpers import ParityHarness

# Harmless once the entry point names the family.
register_family(FAMILY)

FLUX = ParityHarness(
    blocks_class=FluxAutoBlocks,
    make_tiny_repo=make_tiny_repo,
    classic={"text2image": FluxPipeline, "image2image": FluxImg2ImgPipeline, "control": FluxControlPipeline},
    components=(
        "transformer",
        "vae",
        "text_encoder",
        "tokenizer",
        "text_encoder_2",
        "tokenizer_2",
        "scheduler",
    ),
)
COMPONENTS = FLUX.components
classic_from, run_both = FLUX.classic_from, FLUX.run_both

flux_repo = FLUX.repo_fixture("tiny-flux", "A tiny Flux repo (FluxPipeline, guidance-embedding transformer).")
flux_control_repo = FLUX.repo_fixture(
    "tiny-flux-control",
    "A tiny Flux control repo (FluxControlPipeline, transformer with doubled input channels).",
    control=True,
)
flux_pipe = FLUX.pipe_fixture("flux_repo")
flux_control_pipe = FLUX.pipe_fixture("flux_control_repo")


def make_image(seed=0, size=32):
    """A random RGB PIL image, the same for the same seed."""
    return helpers.make_image(seed, size)
