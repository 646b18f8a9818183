"""A refiner repo (text_encoder_2 only) through from_pretrained: the family picks the refiner blocks."""

import json

import torch

from blocks.stable_diffusion_xl import (
    StableDiffusionXLAutoBlocks,
    StableDiffusionXLRefinerBlocks,
    make_tiny_repo,
)
from modular import ModularPipeline
from modular.pipeline.index import MODULAR_INDEX


def test_classic_refiner_index_gets_the_refiner_blocks_and_runs(tmp_path):
    """A classic SDXL img2img index without text_encoder maps to the refiner blocks, which load and run."""
    repo = make_tiny_repo(tmp_path / "refiner", refiner=True)
    pipe = ModularPipeline.from_pretrained(repo)
    assert isinstance(pipe.blocks, StableDiffusionXLRefinerBlocks)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    image = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    latents = pipe(
        prompt="a cat",
        image=image,
        num_inference_steps=4,
        strength=0.5,
        output_type="latent",
        output="images",
    )
    assert latents.shape[0] == 1


def test_saved_refiner_comes_back_as_a_refiner(tmp_path):
    """The saved index names the refiner blocks, and from_pretrained finds them by that name."""
    pipe = ModularPipeline.from_pretrained(make_tiny_repo(tmp_path / "refiner", refiner=True))
    pipe.load_components(torch_dtype=torch.float32)
    pipe.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / MODULAR_INDEX).read_text())["_blocks_class_name"] == (
        "StableDiffusionXLRefinerBlocks"
    )
    assert isinstance(
        ModularPipeline.from_pretrained(tmp_path / "saved").blocks, StableDiffusionXLRefinerBlocks
    )


def test_a_base_repo_still_gets_the_auto_blocks(tmp_path):
    """A base SDXL repo maps to the auto blocks."""
    pipe = ModularPipeline.from_pretrained(make_tiny_repo(tmp_path / "base"))
    assert isinstance(pipe.blocks, StableDiffusionXLAutoBlocks)
