"""SD3's denoiser asks a ``guider`` component (diffusers' guiders) like the other families'.

The default guider (classifier-free, scale 7.0) keeps the classic parity suite bit for bit (test_sd3_parity.py).
Here: the default itself, swapping it, and a guider that perturbs the transformer (diffusers' own
skip-layer guidance) against diffusers' own modular SD3 pipeline: both run one pass per condition, so they agree
bit for bit.
"""

import logging

import pytest
import torch
from diffusers.guiders import ClassifierFreeGuidance, LTX2Guidance, SkipLayerGuidance
from diffusers.hooks import LayerSkipConfig
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline

from ..helpers import STEPS, hooked_modules, seeded
from .conftest import COMPONENTS

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

# The peer guides only with a negative prompt given (it encodes no empty one by default).
INPUTS = {"prompt": "a cat", "negative_prompt": "blurry", "num_inference_steps": STEPS}


def run(pipe, **kwargs):
    return pipe(generator=seeded(0), output="latents", **{**INPUTS, **kwargs})


@pytest.fixture
def pipe(sd3_pipe):
    """The shared pipeline with its default guider put back after the test."""
    guider = sd3_pipe.guider
    yield sd3_pipe
    sd3_pipe.update_components(guider=guider)


def test_the_default_guider_is_the_classic_formula(pipe):
    """ClassifierFreeGuidance(guidance_scale=7.0), uncond + scale * (cond - uncond), made from config."""
    assert type(pipe.guider) is ClassifierFreeGuidance
    assert (pipe.guider.guidance_scale, pipe.guider.use_original_formulation) == (7.0, False)
    assert pipe.get_component_spec("guider").default_creation_method == "from_config"


def test_a_disabled_guider_gives_the_unguided_result(pipe):
    """ClassifierFreeGuidance(enabled=False) runs only the prompt: what guidance_scale=1 gives."""
    expected = run(pipe, guidance_scale=1.0)
    pipe.update_components(guider=ClassifierFreeGuidance(enabled=False))
    assert torch.equal(run(pipe), expected)


def test_a_swapped_in_guiders_own_scale_is_the_calls_default(pipe):
    """A call without guidance_scale guides at the swapped-in guider's scale (3.0); a call's guidance_scale
    holds for that call only, and the guider keeps its scale and state."""
    at_three, at_five = run(pipe, guidance_scale=3.0), run(pipe, guidance_scale=5.0)
    guider = ClassifierFreeGuidance(guidance_scale=3.0)
    pipe.update_components(guider=guider)
    state = guider.get_state()
    assert torch.equal(run(pipe), at_three)
    assert torch.equal(run(pipe, guidance_scale=5.0), at_five)
    assert torch.equal(run(pipe), at_three)
    assert (guider.guidance_scale, guider.get_state()) == (3.0, state)


def _slg():
    config = LayerSkipConfig(
        indices=[1], fqn="transformer_blocks", skip_attention=False, skip_attention_scores=False, skip_ff=True
    )
    return SkipLayerGuidance(
        guidance_scale=4.0,
        skip_layer_guidance_scale=2.0,
        skip_layer_guidance_start=0.0,
        skip_layer_guidance_stop=1.0,
        skip_layer_config=config,
    )


@pytest.fixture(scope="module")
def peer(sd3_repo, sd3_pipe):
    """diffusers' own modular SD3 pipeline on the tiny repo, on our pipeline's components."""
    peer = PeerPipeline.from_pretrained(str(sd3_repo))
    peer.update_components(**{name: getattr(sd3_pipe, name) for name in COMPONENTS})
    peer.set_progress_bar_config(disable=True)
    return peer


def test_a_guider_that_perturbs_the_transformer_equals_the_peers_pipeline(pipe, peer):
    """diffusers' SkipLayerGuidance (skipping a joint block's feed-forward; its attention-score and attention
    skips do not take SD3's joint attention, in the peer either): one pass per condition with the guider's
    hooks, bit for bit the peer's modular SD3; the hooks are off the transformer afterwards, and the guider
    changed the result."""
    plain = run(pipe, guidance_scale=4.0)
    peer.update_components(guider=_slg())
    theirs = peer(generator=seeded(0), output="latents", **INPUTS)
    pipe.update_components(guider=_slg())
    ours = run(pipe, guidance_scale=4.0)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, plain)
    assert hooked_modules(pipe.transformer) == []


def test_a_guider_the_denoiser_cannot_serve_is_refused(pipe):
    """LTX2Guidance's extra predictions are refused by update_components; the guider stays as it was."""
    guider = pipe.guider
    with pytest.raises(ValueError, match=r"^SD3LoopDenoiser: LTX2Guidance asks for predictions"):
        pipe.update_components(guider=LTX2Guidance(guidance_scale=3.0, stg_scale=1.0))
    assert pipe.guider is guider
