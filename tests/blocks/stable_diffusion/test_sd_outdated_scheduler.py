"""Repos whose scheduler config is outdated (steps_offset 0, clip_sample true, skip_prk_steps false), as old SD
repos on the hub ship them: the classic pipelines rewrite those keys when built (with a FutureWarning), each
workflow its own, and our images equal theirs, with the same kind of warning; the pipeline's scheduler keeps the
repo's config."""

import json
import warnings

import pytest
import torch
from diffusers import (
    DDIMScheduler,
    PNDMScheduler,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
)

from blocks.stable_diffusion import make_tiny_repo

from ..helpers import assert_identical, make_image, make_mask, seeded
from .conftest import SD


def with_scheduler(repo, scheduler):
    """`repo` with `scheduler` saved as its scheduler and named in its model_index.json."""
    scheduler.save_pretrained(repo / "scheduler")
    index = json.loads((repo / "model_index.json").read_text())
    index["scheduler"] = ["diffusers", type(scheduler).__name__]
    (repo / "model_index.json").write_text(json.dumps(index))
    return repo


@pytest.fixture(scope="module")
def ddim_repo(tmp_path_factory):
    """A tiny SD repo whose DDIM scheduler has steps_offset 0 and clip_sample true."""
    repo = make_tiny_repo(tmp_path_factory.mktemp("outdated") / "tiny-sd-ddim")
    config = {**PNDMScheduler.load_config(repo / "scheduler"), "steps_offset": 0, "clip_sample": True}
    config.pop("skip_prk_steps")
    return with_scheduler(repo, DDIMScheduler.from_config(config))


@pytest.fixture(scope="module")
def pndm_inpaint_repo(tmp_path_factory):
    """A tiny SD inpainting repo whose PNDM scheduler has steps_offset 0 and skip_prk_steps false."""
    repo = make_tiny_repo(tmp_path_factory.mktemp("outdated") / "tiny-sd-pndm", inpainting=True)
    config = {**PNDMScheduler.load_config(repo / "scheduler"), "steps_offset": 0, "skip_prk_steps": False}
    return with_scheduler(repo, PNDMScheduler.from_config(config))


CASES = {
    "text2image": (StableDiffusionPipeline, "ddim_repo", {}, ["steps_offset", "clip_sample"]),
    "image2image": (
        StableDiffusionImg2ImgPipeline,
        "ddim_repo",
        {"image": make_image()},
        ["steps_offset", "clip_sample"],
    ),
    "inpainting": (
        StableDiffusionInpaintPipeline,
        "pndm_inpaint_repo",
        {"image": make_image(), "mask_image": make_mask()},
        ["steps_offset", "skip_prk_steps"],
    ),
}


@pytest.mark.parametrize("workflow", list(CASES))
def test_an_outdated_scheduler_config_gives_the_classic_pipelines_images(request, workflow):
    """Each workflow fixes the keys its classic pipeline fixes, warns naming each, and equals that pipeline."""
    classic_class, repo_fixture, images, keys = CASES[workflow]
    repo = request.getfixturevalue(repo_fixture)
    inputs = {"prompt": "a cat", "num_inference_steps": 4, "output_type": "np", **images}
    with pytest.warns(FutureWarning, match="steps_offset"):
        classic = classic_class.from_pretrained(
            repo, torch_dtype=torch.float32, safety_checker=None, requires_safety_checker=False
        )
    classic.set_progress_bar_config(disable=True)
    theirs = classic(generator=seeded(0), **inputs).images
    ours_pipe = SD.load_pipeline(repo)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        ours = ours_pipe(generator=seeded(0), output="images", **inputs)
    assert_identical(ours, theirs)
    messages = [str(w.message) for w in warned if issubclass(w.category, FutureWarning)]
    for key in keys:
        assert any(f"sets {key}=" in m and classic_class.__name__ in m for m in messages)
    assert ours_pipe.scheduler.config.steps_offset == 0  # the pipeline's scheduler keeps the repo's config
