"""Wan's denoiser asks a ``guider`` component (diffusers' guiders): the default reproduces the classic pipelines'
guidance bit for bit (the parity suite), a guider's own scale sets the call's, and a guider that perturbs the
transformer (skip-layer guidance) runs on each expert."""

import logging

import pytest
import torch
from diffusers.guiders import ClassifierFreeGuidance, SkipLayerGuidance
from diffusers.hooks import LayerSkipConfig

from ..helpers import STEPS, assert_identical, forwards_of, hooked_modules, seeded
from .conftest import VIDEO, run_both

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

INPUTS = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **VIDEO}


def run(pipe, **kwargs):
    return pipe(generator=seeded(0), output="videos", **{**INPUTS, **kwargs})


@pytest.fixture
def pipe(wan22_pipe):
    """The shared two-expert pipeline with its default guider put back after the test."""
    guider = wan22_pipe.guider
    yield wan22_pipe
    wan22_pipe.update_components(guider=guider)


def test_the_default_guider_is_the_classic_formula(pipe):
    """ClassifierFreeGuidance(guidance_scale=5.0) in its Imagen formulation (neg + scale x (pos - neg)), from config."""
    assert type(pipe.guider) is ClassifierFreeGuidance
    assert (pipe.guider.guidance_scale, pipe.guider.use_original_formulation) == (5.0, False)
    assert pipe.get_component_spec("guider").default_creation_method == "from_config"


def test_the_guiders_scale_is_the_calls_default(pipe):
    """A guider of scale 3 gives what the default guider gives at guidance_scale=3 (the classic pipeline's result
    at 3), for both experts; the guider keeps its scale after the call."""
    expected, theirs = run_both(pipe, "text2video", **{**INPUTS, "guidance_scale": 3.0})
    assert_identical(expected, theirs)
    pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=3.0))
    assert torch.equal(run(pipe), expected)
    assert pipe.guider.guidance_scale == 3.0


def test_a_disabled_guider_gives_the_unguided_result(pipe):
    """ClassifierFreeGuidance(enabled=False) runs only the prompt: what guidance_scale=1 gives."""
    expected = run(pipe, guidance_scale=1.0)
    pipe.update_components(guider=ClassifierFreeGuidance(enabled=False))
    assert torch.equal(run(pipe), expected)


def test_skip_layer_guidance_perturbs_each_expert_and_removes_its_hooks(pipe):
    """Skip-layer guidance on the experts' first block changes the result and adds a perturbed pass to each
    expert's steps (every step but the first, by diffusers' rule), and leaves no hook on either after the call."""
    steps = 6
    pipe.scheduler.set_timesteps(steps)
    high = sum(t >= 875 for t in pipe.scheduler.timesteps.tolist())  # boundary_ratio 0.875
    plain = run(pipe, num_inference_steps=steps)
    config = LayerSkipConfig(indices=[0], fqn="blocks", skip_attention=True)
    guider = SkipLayerGuidance(
        guidance_scale=5.0,
        skip_layer_config=[config],
        skip_layer_guidance_start=0.0,
        skip_layer_guidance_stop=1.0,
    )
    pipe.update_components(guider=guider)
    with forwards_of(pipe.transformer) as first, forwards_of(pipe.transformer_2) as second:
        guided = run(pipe, num_inference_steps=steps)
    assert not torch.equal(guided, plain)
    assert 1 < high < steps
    assert (len(first), len(second)) == (3 * high - 1, 3 * (steps - high))
    assert hooked_modules(pipe.transformer) == hooked_modules(pipe.transformer_2) == []
