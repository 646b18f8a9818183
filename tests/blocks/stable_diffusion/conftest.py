"""Shared fixtures for the Stable Diffusion tests: tiny repos, our pipelines and the classic ones."""

from diffusers import (
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
)

from blocks.stable_diffusion import StableDiffusionAutoBlocks, make_tiny_repo

from ..helpers import ParityHarness

SD = ParityHarness(
    blocks_class=StableDiffusionAutoBlocks,
    make_tiny_repo=make_tiny_repo,
    classic={
        "text2image": StableDiffusionPipeline,
        "image2image": StableDiffusionImg2ImgPipeline,
        "inpainting": StableDiffusionInpaintPipeline,
    },
    components=("vae", "text_encoder", "tokenizer", "unet", "scheduler"),
    classic_options={"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False},
)
classic_from, run_both = SD.classic_from, SD.run_both

sd_repo = SD.repo_fixture("tiny-sd", "A tiny SD repo with a 4-channel UNet.")
sd_inpaint_repo = SD.repo_fixture(
    "tiny-sd-inpaint", "A tiny SD inpainting repo with a 9-channel UNet.", inpainting=True
)
sd_vae4_repo = SD.repo_fixture(
    "tiny-sd-vae4", "A tiny SD repo whose VAE has 3 levels: 4 pixels per latent cell.", vae_levels=3
)
sd_pipe = SD.pipe_fixture("sd_repo")
sd_inpaint_pipe = SD.pipe_fixture("sd_inpaint_repo")
sd_vae4_pipe = SD.pipe_fixture("sd_vae4_repo")
