"""Shared fixtures for the Qwen-Image tests: tiny repos, our pipelines and the classic ones on their components.

Edit resizes its input image to about 1024 x 1024 pixels (diffusers' ``calculate_dimensions`` at a fixed area),
whatever the output size: 4096 latent tokens, seconds per call with the tiny models on CPU. The ``small_edit_area``
fixture makes that area 64 x 64 for our pipeline and the classic one alike (both look the function up on its
module at each call); test_edit_parity_at_the_real_area runs the real area once.
"""

import pytest
import torch
from diffusers import QwenImageEditPipeline, QwenImagePipeline
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit

import modular
from blocks.qwenimage import (
    FAMILY,
    QwenImageAutoBlocks,
    QwenImageEditAutoBlocks,
    make_tiny_edit_repo,
    make_tiny_repo,
)
from blocks.qwenimage.tiny import load_tiny_processor

from .. import helpers
from ..helpers import ParityHarness

# Until the lead adds the entry point to pyproject.toml; harmless once it exists.
modular.register_family(FAMILY)

SIZE = 32  # pixels; 4x4 latents, 2x2 transformer tokens
EDIT_AREA_SIDE = 64  # the edit's working image in the tests: 64 x 64 pixels, 16 latent tokens

QWEN_IMAGE = ParityHarness(
    blocks_class=QwenImageAutoBlocks,
    make_tiny_repo=make_tiny_repo,
    classic={"text2image": QwenImagePipeline},
    components=("transformer", "vae", "text_encoder", "tokenizer", "scheduler"),
)
QWEN_IMAGE_EDIT = ParityHarness(
    blocks_class=QwenImageEditAutoBlocks,
    make_tiny_repo=make_tiny_edit_repo,
    classic={"edit": QwenImageEditPipeline},
    # The classic edit pipeline takes a tokenizer it never uses; ours has none (None is passed).
    components=("transformer", "vae", "text_encoder", "tokenizer", "processor", "scheduler"),
)
COMPONENTS = QWEN_IMAGE.components
classic_from, run_both = QWEN_IMAGE.classic_from, QWEN_IMAGE.run_both
edit_classic_from, run_both_edit = QWEN_IMAGE_EDIT.classic_from, QWEN_IMAGE_EDIT.run_both

qwen_repo = QWEN_IMAGE.repo_fixture("tiny-qwen-image", "A tiny Qwen-Image repo.")
qwen_pipe = QWEN_IMAGE.pipe_fixture("qwen_repo")
qwen_edit_repo = QWEN_IMAGE_EDIT.repo_fixture("tiny-qwen-image-edit", "A tiny Qwen-Image-Edit repo.")


def load_edit_pipeline(repo, blocks_class=QwenImageEditAutoBlocks, components_manager=None):
    """Our edit pipeline on `repo` in float32; the processor read by ``load_tiny_processor`` (torchvision-free)."""
    pipe = blocks_class().init_pipeline(repo, components_manager=components_manager)
    names = [name for name in pipe.pretrained_component_names if name != "processor"]
    pipe.load_components(names=names, torch_dtype=torch.float32)
    pipe.update_components(processor=load_tiny_processor(repo))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def qwen_edit_pipe(qwen_edit_repo):
    """Our edit pipeline on the tiny edit repo, loaded in float32."""
    return load_edit_pipeline(qwen_edit_repo)


@pytest.fixture
def small_edit_area(monkeypatch):
    """Edit works on a 64 x 64 image instead of about 1024 x 1024, for ours and the classic pipeline alike."""
    real = pipeline_qwenimage_edit.calculate_dimensions
    monkeypatch.setattr(
        pipeline_qwenimage_edit,
        "calculate_dimensions",
        lambda area, ratio: real(EDIT_AREA_SIDE * EDIT_AREA_SIDE, ratio),
    )


def make_image(seed=0, size=SIZE, height=None):
    """A random RGB PIL image, the same for the same seed."""
    return helpers.make_image(seed, size, height)
