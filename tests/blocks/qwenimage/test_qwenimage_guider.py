"""Qwen-Image's denoiser asks a ``guider`` component (diffusers' guiders) for its true classifier-free guidance.

The default guider (ClassifierFreeGuidance, scale 4.0, the Imagen formulation neg + scale * (pos - neg)) keeps
the classic parity suite bit for bit (test_qwenimage_parity.py). Here: the default itself, swapping it, the
norm rescale, and guiders that perturb the transformer (PAG).
"""

import logging

import pytest
import torch
from diffusers.guiders import ClassifierFreeGuidance, LTX2Guidance, PerturbedAttentionGuidance

from ..helpers import STEPS, hooked_modules, seeded
from .conftest import SIZE

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

INPUTS = {"prompt": "a cat", "negative_prompt": "blurry", "height": SIZE, "width": SIZE}


def run(pipe, **kwargs):
    return pipe(generator=seeded(0), output="latents", num_inference_steps=STEPS, **{**INPUTS, **kwargs})


@pytest.fixture
def pipe(qwen_pipe):
    """The shared pipeline with its default guider put back after the test."""
    guider = qwen_pipe.guider
    yield qwen_pipe
    qwen_pipe.update_components(guider=guider)


def test_the_default_guider_is_the_classic_formula(pipe):
    """ClassifierFreeGuidance(guidance_scale=4.0) in the Imagen formulation, made from config."""
    assert type(pipe.guider) is ClassifierFreeGuidance
    assert (pipe.guider.guidance_scale, pipe.guider.use_original_formulation) == (4.0, False)
    assert pipe.get_component_spec("guider").default_creation_method == "from_config"


def test_a_disabled_guider_gives_the_unguided_result(pipe):
    """ClassifierFreeGuidance(enabled=False) runs only the prompt: what true_cfg_scale=1 gives."""
    expected = run(pipe, true_cfg_scale=1.0)
    assert not torch.equal(expected, run(pipe))
    pipe.update_components(guider=ClassifierFreeGuidance(enabled=False))
    assert torch.equal(run(pipe), expected)


def test_the_calls_scale_overrides_a_swapped_in_guiders_own(pipe):
    """A guider of scale 2.0 guides calls that give no true_cfg_scale at 2.0; a call's true_cfg_scale holds for
    that call only, and the guider keeps its own scale."""
    at_two, at_four = run(pipe, true_cfg_scale=2.0), run(pipe)
    guider = ClassifierFreeGuidance(guidance_scale=2.0)
    pipe.update_components(guider=guider)
    assert torch.equal(run(pipe), at_two)
    assert torch.equal(run(pipe, true_cfg_scale=4.0), at_four)
    assert torch.equal(run(pipe), at_two)
    assert guider.guidance_scale == 2.0


def test_norm_rescale_off_gives_the_plain_guided_prediction(pipe):
    """norm_rescale=False leaves out the classic rescale to the positive prediction's norm: another result, and
    without guidance (one prediction) the option changes nothing."""
    assert not torch.equal(run(pipe, norm_rescale=False), run(pipe))
    unguided = {"true_cfg_scale": 1.0}
    assert torch.equal(run(pipe, norm_rescale=False, **unguided), run(pipe, **unguided))


def test_pag_perturbs_the_transformer_and_leaves_no_hooks(pipe):
    """PerturbedAttentionGuidance runs one pass per condition with its hooks on the transformer's first block:
    a result other than plain CFG's, and the hooks are off the transformer afterwards."""
    plain = run(pipe)
    pipe.update_components(
        guider=PerturbedAttentionGuidance(
            guidance_scale=4.0,
            perturbed_guidance_scale=2.0,
            perturbed_guidance_start=-1.0,
            perturbed_guidance_stop=1.0,
            perturbed_guidance_layers=[0],
        )
    )
    ours = run(pipe)
    assert (ours - plain).abs().max() > 1e-3
    assert hooked_modules(pipe.transformer) == []


def test_a_guider_the_denoiser_cannot_serve_is_refused(pipe):
    """LTX2Guidance's extra predictions are refused by update_components; the guider stays as it was."""
    guider = pipe.guider
    with pytest.raises(ValueError, match=r"^QwenImageLoopDenoiser: LTX2Guidance asks for predictions"):
        pipe.update_components(guider=LTX2Guidance(guidance_scale=3.0, stg_scale=1.0))
    assert pipe.guider is guider
