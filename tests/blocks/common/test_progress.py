"""The denoising loop's progress bar counts scheduler steps, as the classic pipelines' bars do."""

import io
import re

import pytest
import torch
from diffusers import EulerDiscreteScheduler, PNDMScheduler, StableDiffusionPipeline

from blocks.common.denoise_loop import progress_ticks
from blocks.stable_diffusion import make_tiny_repo
from modular import ComponentsManager, ModularPipeline


def last_count(text: str) -> str:
    """The last `n/total` a tqdm bar printed."""
    return re.findall(r"(\d+/\d+)", text)[-1]


@pytest.mark.parametrize("scheduler_class", [PNDMScheduler, EulerDiscreteScheduler])
def test_the_bar_ends_at_its_total_as_the_classic_pipelines_does(tmp_path, scheduler_class):
    """PNDM runs one warm-up timestep more than the steps: the bar still ends at `2/2` (it showed `3it`),
    as the classic pipeline's does, with the same scheduler."""
    pipe = ModularPipeline.from_pretrained(
        make_tiny_repo(tmp_path / "sd"), components_manager=ComponentsManager()
    )
    pipe.load_components(torch_dtype=torch.float32)
    pipe.update_components(scheduler=scheduler_class.from_config(pipe.scheduler.config))
    ours, theirs = io.StringIO(), io.StringIO()
    pipe.set_progress_bar_config(file=ours)
    pipe(prompt="a cat", num_inference_steps=2, output_type="latent")
    names = ("unet", "vae", "text_encoder", "tokenizer", "scheduler")
    classic = StableDiffusionPipeline(
        **{name: getattr(pipe, name) for name in names},
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    classic.set_progress_bar_config(file=theirs)
    classic(prompt="a cat", num_inference_steps=2, output_type="latent")
    assert last_count(ours.getvalue()) == last_count(theirs.getvalue()) == "2/2"
    assert not re.search(
        r"(?<![\d.])3it|3/2", ours.getvalue()
    )  # tqdm's count past an unknown or too small total


def test_ticks_count_scheduler_steps():
    """One tick per step: after PNDM's warm-up, every second timestep of a second-order scheduler, the last always."""
    assert progress_ticks(3, 2, 1) == [False, True, True]  # PNDM: a warm-up timestep first
    assert progress_ticks(4, 2, 2) == [False, True, False, True]  # Heun: two timesteps a step
    assert progress_ticks(2, 2, 1) == [True, True]
