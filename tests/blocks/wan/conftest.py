"""Shared fixtures for the Wan tests: tiny repos of each kind, our pipelines, the classic ones on their components."""

import pytest
import torch
from diffusers import WanImageToVideoPipeline, WanPipeline

import modular
from blocks.wan import FAMILY, Wan22Blocks, make_tiny_repo

from .. import helpers
from ..helpers import ParityHarness

# Until the lead adds the entry point to pyproject.toml; harmless once it exists.
modular.register_family(FAMILY)

SIZE = 32  # pixels; 4x4 latent cells, 2x2 transformer patches
FRAMES = 5  # two latent frames
VIDEO = {"height": SIZE, "width": SIZE, "num_frames": FRAMES}

WAN = ParityHarness(
    blocks_class=Wan22Blocks,
    make_tiny_repo=make_tiny_repo,
    classic={"text2video": WanPipeline, "image2video": WanImageToVideoPipeline},
    components=("transformer", "transformer_2", "vae", "text_encoder", "tokenizer", "scheduler"),
    output="videos",
    classic_output="frames",
)
# Image-to-video adds the image encoder and its processor (None in Wan 2.2 repos).
WAN_I2V = ParityHarness(
    blocks_class=Wan22Blocks,
    make_tiny_repo=make_tiny_repo,
    classic={"image2video": WanImageToVideoPipeline},
    components=(*WAN.components, "image_encoder", "image_processor"),
    output="videos",
    classic_output="frames",
)


def classic_from(pipe, workflow="text2video", **config):
    """The classic pipeline of `workflow` on `pipe`'s objects, with `pipe`'s boundary_ratio."""
    harness = WAN_I2V if workflow == "image2video" else WAN
    return harness.classic_from(pipe, workflow, boundary_ratio=pipe.config["boundary_ratio"], **config)


def run_both(pipe, workflow="text2video", seed=0, **kwargs):
    """Ours and the classic pipeline of `workflow` on the same objects, config and inputs."""
    harness = WAN_I2V if workflow == "image2video" else WAN
    config = {"boundary_ratio": pipe.config["boundary_ratio"]}
    return harness.run_both(pipe, workflow, seed=seed, classic_config=config, **{**VIDEO, **kwargs})


def _pipe(repo):
    pipe = modular.ModularPipeline.from_pretrained(repo)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _kind_fixtures(kind: str):
    repo = WAN.repo_fixture(f"tiny-{kind}", f"A tiny {kind} repo.", kind=kind)

    def pipe(request):
        return _pipe(request.getfixturevalue(f"{kind.replace('.', '').replace('-', '_')}_repo"))

    pipe.__doc__ = f"Our pipeline on the tiny {kind} repo (from its index), loaded in float32."
    return repo, pytest.fixture(scope="session")(pipe)


wan21_repo, wan21_pipe = _kind_fixtures("wan2.1")
wan22_repo, wan22_pipe = _kind_fixtures("wan2.2")
wan21_i2v_repo, wan21_i2v_pipe = _kind_fixtures("wan2.1-i2v")
wan22_i2v_repo, wan22_i2v_pipe = _kind_fixtures("wan2.2-i2v")


def make_image(seed=0, size=SIZE):
    """A random RGB PIL image, the same for the same seed."""
    return helpers.make_image(seed, size)
