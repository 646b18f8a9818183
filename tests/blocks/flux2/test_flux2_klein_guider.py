"""Flux.2 Klein's denoiser asks a ``guider`` component (diffusers' guiders), as Z-Image's and Qwen-Image's do.

The default guider (classifier-free, scale 4.0) keeps the Klein parity bit for bit (test_flux2_klein.py). Here:
the default itself, swapping it, adaptive projected guidance against the peer's Klein
pipeline, a guider the denoiser cannot serve, and saving a changed guider.
"""

import logging

import pytest
import torch
from diffusers.guiders import AdaptiveProjectedGuidance, ClassifierFreeGuidance, LTX2Guidance
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline

from modular import ModularPipeline

from ..helpers import STEPS, seeded
from .conftest import COMPONENTS, SIZE

logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

INPUTS = {
    "prompt": "a cat",
    "height": SIZE,
    "width": SIZE,
    "num_inference_steps": STEPS,
    "output_type": "latent",
}


def run(pipe, **kwargs):
    return pipe(generator=seeded(0), output="images", **{**INPUTS, **kwargs})


@pytest.fixture
def pipe(klein_pipe):
    """The shared Klein pipeline with its default guider put back after the test."""
    guider = klein_pipe.guider
    yield klein_pipe
    klein_pipe.update_components(guider=guider)


def test_the_default_guider_is_the_classic_formula(pipe):
    """ClassifierFreeGuidance(guidance_scale=4.0), not in the original formulation, made from config."""
    assert type(pipe.guider) is ClassifierFreeGuidance
    assert (pipe.guider.guidance_scale, pipe.guider.use_original_formulation) == (4.0, False)
    assert pipe.get_component_spec("guider").default_creation_method == "from_config"


def test_a_disabled_guider_gives_the_unguided_result(pipe):
    """ClassifierFreeGuidance(enabled=False) runs only the prompt: what guidance_scale=1 gives."""
    expected, guided = run(pipe, guidance_scale=1.0), run(pipe)
    pipe.update_components(guider=ClassifierFreeGuidance(enabled=False))
    assert torch.equal(run(pipe), expected)
    assert not torch.equal(guided, expected)


def test_a_swapped_in_guiders_scale_is_the_calls_default(pipe):
    """A call without guidance_scale guides at the swapped-in guider's scale; a call's scale holds for that call."""
    at_two, at_four = run(pipe, guidance_scale=2.0), run(pipe, guidance_scale=4.0)
    guider = ClassifierFreeGuidance(guidance_scale=2.0)
    pipe.update_components(guider=guider)
    assert torch.equal(run(pipe), at_two)
    assert torch.equal(run(pipe, guidance_scale=4.0), at_four)
    assert guider.guidance_scale == 2.0


def test_adaptive_projected_guidance_equals_the_peers_klein_pipeline(pipe, klein_repo):
    """Adaptive projected guidance (its momentum kept per call) gives the peer's Klein base pipeline's latents bit
    for bit, and differs from classifier-free guidance. (Guiders that perturb the transformer cannot run on
    Flux.2 in this diffusers: its layer-skip and PAG hooks need Attention.is_cross_attention, which
    Flux2Attention lacks, in the peer as in ours.)"""

    def apg():
        return AdaptiveProjectedGuidance(guidance_scale=4.0, adaptive_projected_guidance_momentum=-0.5)

    plain = run(pipe, output_type="pt")
    peer = PeerPipeline.from_pretrained(str(klein_repo))
    peer.update_components(**{name: pipe.components[name] for name in COMPONENTS}, guider=apg())
    peer.set_progress_bar_config(disable=True)
    theirs = peer(generator=seeded(0), output="images", **{**INPUTS, "output_type": "pt"})
    pipe.update_components(guider=apg())
    ours = run(pipe, output_type="pt")
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, plain)
    assert torch.equal(run(pipe, output_type="pt"), ours)  # the momentum starts afresh each call


def test_a_guider_the_denoiser_cannot_serve_is_refused(pipe):
    """LTX2Guidance's extra predictions are refused by update_components; the guider stays as it was."""
    guider = pipe.guider
    with pytest.raises(ValueError, match=r"^Flux2KleinLoopDenoiser: LTX2Guidance asks for predictions"):
        pipe.update_components(guider=LTX2Guidance(guidance_scale=3.0, stg_scale=1.0))
    assert pipe.guider is guider


def test_a_changed_guider_is_saved_and_comes_back(pipe, tmp_path):
    """The default guider is not saved; a changed one is, and the saved folder makes it again, same output."""
    pipe.save_pretrained(tmp_path / "default")
    assert not (tmp_path / "default" / "guider").exists()
    pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=2.5))
    expected = run(pipe)
    pipe.save_pretrained(tmp_path / "changed")
    again = ModularPipeline.from_pretrained(tmp_path / "changed")
    again.load_components(torch_dtype=torch.float32)
    again.set_progress_bar_config(disable=True)
    assert again.guider.guidance_scale == 2.5
    assert torch.equal(run(again), expected)
