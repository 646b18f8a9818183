"""Z-Image's denoiser asks a ``guider`` component (diffusers' guiders) like Stable Diffusion's and SDXL's.

The default guider (classifier-free, original formulation, scale 5.0) keeps the classic parity suite bit for bit,
cfg_truncation and cfg_normalization included (test_z_image_parity.py). Here: the default itself, swapping it,
and guiders that perturb the transformer (PAG, skip-layer guidance) against diffusers' own modular Z-Image
pipeline: both run one pass per condition, so they agree bit for bit.
"""

import logging

import pytest
import torch
from diffusers.guiders import (
    ClassifierFreeGuidance,
    LTX2Guidance,
    PerturbedAttentionGuidance,
    SkipLayerGuidance,
)
from diffusers.hooks import LayerSkipConfig
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline

from ..helpers import STEPS, hooked_modules, seeded
from .conftest import SIZE

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

INPUTS = {"prompt": "a cat", "height": SIZE, "width": SIZE, "num_inference_steps": STEPS}


def run(pipe, **kwargs):
    return pipe(generator=seeded(0), output="latents", **{**INPUTS, **kwargs})


@pytest.fixture
def pipe(zimage_pipe):
    """The shared pipeline with its default guider put back after the test."""
    guider = zimage_pipe.guider
    yield zimage_pipe
    zimage_pipe.update_components(guider=guider)


def test_the_default_guider_is_the_classic_formula(pipe):
    """ClassifierFreeGuidance(guidance_scale=5.0, use_original_formulation=True), made from config."""
    assert type(pipe.guider) is ClassifierFreeGuidance
    assert (pipe.guider.guidance_scale, pipe.guider.use_original_formulation) == (5.0, True)
    assert pipe.get_component_spec("guider").default_creation_method == "from_config"


def test_a_disabled_guider_gives_the_unguided_result(pipe):
    """ClassifierFreeGuidance(enabled=False) runs only the prompt: what guidance_scale=0 gives."""
    expected = run(pipe, guidance_scale=0.0)
    pipe.update_components(guider=ClassifierFreeGuidance(use_original_formulation=True, enabled=False))
    assert torch.equal(run(pipe), expected)


def test_the_calls_guidance_scale_sets_the_guiders_scale(pipe):
    """A guider of another scale gives the default's results when the call gives the scale, cfg_truncation
    included; the guider keeps its own scale and state after calls (each call guides with a copy)."""
    expected = run(pipe, guidance_scale=4.0)
    truncated = run(pipe, guidance_scale=4.0, cfg_truncation=0.1)
    guider = ClassifierFreeGuidance(guidance_scale=2.0, use_original_formulation=True)
    pipe.update_components(guider=guider)
    state = guider.get_state()
    assert torch.equal(run(pipe, guidance_scale=4.0), expected)
    assert torch.equal(run(pipe, guidance_scale=4.0, cfg_truncation=0.1), truncated)
    assert not torch.equal(truncated, expected)
    assert (guider.guidance_scale, guider.get_state()) == (2.0, state)


def test_a_swapped_in_guiders_own_scale_is_the_calls_default(pipe):
    """A call without guidance_scale guides at the swapped-in guider's scale (2.0), cfg_truncation included; a
    call's guidance_scale holds for that call only."""
    expected, truncated, at_four = (
        run(pipe, guidance_scale=2.0),
        run(pipe, guidance_scale=2.0, cfg_truncation=0.1),
        run(pipe, guidance_scale=4.0),
    )
    pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=2.0, use_original_formulation=True))
    assert torch.equal(run(pipe), expected)
    assert torch.equal(run(pipe, cfg_truncation=0.1), truncated)
    assert torch.equal(run(pipe, guidance_scale=4.0), at_four)
    assert torch.equal(run(pipe), expected)
    assert pipe.guider.guidance_scale == 2.0


def _pag():
    return PerturbedAttentionGuidance(
        guidance_scale=4.0,
        perturbed_guidance_scale=2.0,
        perturbed_guidance_start=-1.0,
        perturbed_guidance_stop=1.0,
        perturbed_guidance_layers=[0],
    )


def _slg():
    config = LayerSkipConfig(
        indices=[0], fqn="layers", skip_attention=False, skip_attention_scores=True, skip_ff=False
    )
    return SkipLayerGuidance(
        guidance_scale=4.0,
        skip_layer_guidance_scale=2.0,
        skip_layer_guidance_start=0.0,
        skip_layer_guidance_stop=1.0,
        skip_layer_config=config,
    )


@pytest.fixture(scope="module")
def peer(zimage_repo):
    """diffusers' own modular Z-Image pipeline on the tiny repo."""
    peer = PeerPipeline.from_pretrained(str(zimage_repo))
    peer.load_components(torch_dtype=torch.float32)
    peer.set_progress_bar_config(disable=True)
    return peer


@pytest.mark.parametrize("make", [_pag, _slg], ids=["pag", "slg"])
def test_guiders_that_perturb_the_transformer_equal_the_peers_pipeline(pipe, peer, make):
    """PAG and skip-layer guidance: one pass per condition with the guider's hooks, bit for bit the peer's
    modular Z-Image; the hooks are off the transformer afterwards, and the guider changed the result."""
    plain = run(pipe, guidance_scale=4.0)
    peer.update_components(guider=make())
    theirs = peer(generator=seeded(0), output="latents", **INPUTS)
    pipe.update_components(guider=make())
    ours = run(pipe, guidance_scale=4.0)
    assert torch.equal(ours, theirs)
    assert (ours - plain).abs().max() > 1e-2
    assert hooked_modules(pipe.transformer) == []


def test_a_guider_the_denoiser_cannot_serve_is_refused(pipe):
    """LTX2Guidance's extra predictions are refused by update_components; the guider stays as it was."""
    guider = pipe.guider
    with pytest.raises(ValueError, match=r"^ZImageLoopDenoiser: LTX2Guidance asks for predictions"):
        pipe.update_components(guider=LTX2Guidance(guidance_scale=3.0, stg_scale=1.0))
    assert pipe.guider is guider
