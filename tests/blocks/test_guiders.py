"""Guidance as a swappable ``guider`` component (diffusers' guiders) in the Stable Diffusion and SDXL denoisers.

The default guider keeps every family's classic parity (the parity suites). Here: swapping guiders,
PAG against the classic PAG pipelines (bit for bit), APG and skip-layer guidance against diffusers' own modular
SDXL pipeline, guiders on a shared manager and under auto offload, and bad guiders.

PAG is bit for bit because the denoiser runs it as the classic PAG pipelines do: the unconditional, conditional
and perturbed predictions in one UNet batch, with diffusers' PAG attention processors on the perturbed layers
(blocks/common/perturbed_attention.py). APG agrees with the peer only to ~1e-5: it leaves the model alone, so
ours batches its two conditions (as the classic CFG pipelines do) while the peer runs one pass per condition,
and the CPU kernels round differently for different batch sizes.
"""

import logging

import pytest
import torch
from diffusers import StableDiffusionPAGPipeline, StableDiffusionXLPAGPipeline
from diffusers.guiders import (
    AdaptiveProjectedGuidance,
    ClassifierFreeGuidance,
    LTX2Guidance,
    PerturbedAttentionGuidance,
    SkipLayerGuidance,
)
from diffusers.hooks import LayerSkipConfig
from diffusers.modular_pipelines import StableDiffusionXLAutoBlocks as PeerSDXLBlocks

import modular
from blocks.stable_diffusion import StableDiffusionAutoBlocks
from blocks.stable_diffusion import make_tiny_repo as make_sd_repo
from blocks.stable_diffusion_xl import FAMILY as SDXL_FAMILY
from blocks.stable_diffusion_xl import StableDiffusionXLAutoBlocks
from blocks.stable_diffusion_xl import make_tiny_repo as make_sdxl_repo
from components import ComponentsManager
from offload import SimulatedDevice, module_nbytes

from .helpers import hooked_modules, seeded

modular.register_family(SDXL_FAMILY)
logging.getLogger("diffusers.guiders").setLevel(logging.ERROR)  # "guiders are experimental", per guider made

# The tiny UNets' mid block has one transformer block; PAG on it is the classic pag_applied_layers=["mid"].
MID = "mid_block.attentions.0.transformer_blocks"
STEPS = 2
# Loose enough for batch-size rounding (module docstring), far tighter than any guidance change (>1e-2).
ATOL = 1e-4


def mid_layers(indices: list[int]) -> LayerSkipConfig:
    return LayerSkipConfig(
        indices=indices, fqn=MID, skip_attention=False, skip_attention_scores=True, skip_ff=False
    )


def pag(indices=(0,), **config) -> PerturbedAttentionGuidance:
    """PAG on the mid block's transformer blocks `indices` at every step, as the classic PAG pipelines apply it
    (the tiny SD UNet's mid block has one transformer block, the tiny SDXL UNet's two).

    diffusers' PAG guider perturbs only steps strictly after int(start * steps); a start of -1 includes step 0.
    """
    defaults = {
        "perturbed_guidance_scale": 3.0,
        "perturbed_guidance_start": -1.0,
        "perturbed_guidance_stop": 1.0,
    }
    return PerturbedAttentionGuidance(
        perturbed_guidance_config=mid_layers(list(indices)), **{**defaults, **config}
    )


def load(blocks_class, repo, cm=None):
    pipe = blocks_class().init_pipeline(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, **kwargs):
    inputs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", **kwargs}
    return pipe(generator=seeded(0), output="images", **inputs)


@pytest.fixture(scope="module")
def sd_repo(tmp_path_factory):
    return make_sd_repo(tmp_path_factory.mktemp("guiders") / "tiny-sd")


@pytest.fixture(scope="module")
def sdxl_repo(tmp_path_factory):
    return make_sdxl_repo(tmp_path_factory.mktemp("guiders") / "tiny-sdxl")


@pytest.fixture
def sd(sd_repo):
    return load(StableDiffusionAutoBlocks, sd_repo)


@pytest.fixture
def sdxl(sdxl_repo):
    return load(StableDiffusionXLAutoBlocks, sdxl_repo)


# ----- the default guider -----


def test_each_family_declares_classifier_free_guidance_with_its_classic_scale(sd, sdxl):
    """The guider is a from-config ClassifierFreeGuidance: scale 7.5 for SD, 5.0 for SDXL."""
    for pipe, scale in ((sd, 7.5), (sdxl, 5.0)):
        assert type(pipe.guider) is ClassifierFreeGuidance
        assert pipe.guider.guidance_scale == scale
        assert pipe.get_component_spec("guider").default_creation_method == "from_config"


def test_the_calls_guidance_scale_leaves_the_guider_as_it_was(sd):
    """guidance_scale applies to the call only; the pipeline's guider keeps its scale and state."""
    before = (sd.guider.guidance_scale, sd.guider.get_state())
    run(sd, guidance_scale=3.0)
    run(sd, guidance_scale=1.0)
    assert (sd.guider.guidance_scale, sd.guider.get_state()) == before


def test_a_disabled_guider_runs_only_the_conditional_prediction(sd):
    """ClassifierFreeGuidance(enabled=False) gives what guidance_scale=1 gives: one pass, no negatives used."""
    expected = run(sd, guidance_scale=1.0)
    sd.update_components(guider=ClassifierFreeGuidance(guidance_scale=7.5, enabled=False))
    assert torch.equal(run(sd), expected)


def test_a_guider_with_another_scale_changes_nothing_when_the_call_gives_the_scale(sd):
    """The call's guidance_scale sets the guider's classifier-free scale: 7.5 given equals the default guider."""
    expected = run(sd, guidance_scale=7.5)
    sd.update_components(guider=ClassifierFreeGuidance(guidance_scale=2.0))
    assert torch.equal(run(sd, guidance_scale=7.5), expected)
    assert not torch.equal(run(sd, guidance_scale=2.0), expected)


def test_a_swapped_in_guiders_own_scale_is_the_calls_default(sd):
    """A call that passes no guidance_scale guides at the swapped-in guider's scale (3.0: what guidance_scale=3.0
    gives with the default guider), not the default guider's 7.5."""
    expected = run(sd, guidance_scale=3.0)
    sd.update_components(guider=ClassifierFreeGuidance(guidance_scale=3.0))
    assert torch.equal(run(sd), expected)


@pytest.mark.parametrize("family", ["sd", "sdxl"])
def test_a_given_guidance_scale_holds_for_that_call_only(request, family):
    """With a guider of scale 3.0, a call giving guidance_scale=6.0 guides at 6.0, and the next call without one
    at 3.0 again; the guider keeps 3.0 (SD and SDXL)."""
    pipe = request.getfixturevalue(family)
    at_six, at_three = run(pipe, guidance_scale=6.0), run(pipe, guidance_scale=3.0)
    pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=3.0))
    assert torch.equal(run(pipe, guidance_scale=6.0), at_six)
    assert torch.equal(run(pipe), at_three)
    assert pipe.guider.guidance_scale == 3.0


def test_a_guiders_own_rescale_is_the_calls_default(sd):
    """guidance_rescale defaults to the guider's own too: a guider with guidance_rescale=0.7 gives what the call's
    guidance_rescale=0.7 gives, and a call's 0.0 turns it off for that call only."""
    rescaled, plain = run(sd, guidance_rescale=0.7), run(sd)
    sd.update_components(guider=ClassifierFreeGuidance(guidance_scale=7.5, guidance_rescale=0.7))
    assert torch.equal(run(sd), rescaled)
    assert torch.equal(run(sd, guidance_rescale=0.0), plain)
    assert sd.guider.guidance_rescale == 0.7


def test_a_pag_guiders_own_scale_is_the_calls_default(sd):
    """A PAG guider's classifier-free scale (4.0) is the default of calls that pass none (SD's classic PAG
    pipeline at guidance_scale=4.0)."""
    classic = classic_pag(sd)
    theirs = classic(
        prompt="a cat",
        num_inference_steps=STEPS,
        output_type="latent",
        generator=seeded(0),
        guidance_scale=4.0,
        pag_scale=3.0,
    ).images
    sd.update_components(guider=pag(guidance_scale=4.0))
    assert torch.equal(run(sd), theirs)


# ----- PAG against the classic PAG pipelines -----


def classic_pag(sd) -> StableDiffusionPAGPipeline:
    """diffusers' classic PAG pipeline on ``sd``'s components, PAG on the mid block."""
    classic = StableDiffusionPAGPipeline(
        **{name: sd.components[name] for name in ("vae", "text_encoder", "tokenizer", "unet", "scheduler")},
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
        pag_applied_layers=["mid"],
    )
    classic.set_progress_bar_config(disable=True)
    return classic


@pytest.mark.parametrize("prompts", [{"prompt": "a cat"}, {"prompt": ["a cat", "a red dog"]}])
def test_pag_on_sd_equals_the_classic_pag_pipeline(sd, prompts):
    """PerturbedAttentionGuidance on SD equals StableDiffusionPAGPipeline (pag_applied_layers=['mid']) bit for bit."""
    classic = classic_pag(sd)
    inputs = {"num_inference_steps": STEPS, "output_type": "latent", **prompts}
    theirs = classic(generator=seeded(0), pag_scale=3.0, **inputs).images
    plain = run(sd, **prompts)
    sd.update_components(guider=pag(guidance_scale=7.5))
    ours = run(sd, **prompts)
    assert torch.equal(ours, theirs)
    assert (ours - plain).abs().max() > 100 * ATOL  # PAG changed the result


def _processors(unet) -> dict[str, object]:
    return dict(unet.attn_processors)


def test_pag_without_classifier_free_guidance_equals_the_classic_pag_pipeline(sd):
    """guidance_scale=1: PAG alone (cond + scale * (cond - perturbed), the original formulation) equals the
    classic pipeline bit for bit; the batch is (conditional, perturbed) with PAGIdentitySelfAttnProcessor2_0."""
    classic = classic_pag(sd)
    inputs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "latent", "guidance_scale": 1.0}
    theirs = classic(generator=seeded(0), pag_scale=3.0, **inputs).images
    sd.update_components(guider=pag(use_original_formulation=True))
    assert torch.equal(run(sd, guidance_scale=1.0), theirs)


def test_pag_puts_the_unets_attention_processors_back(sd):
    """After a PAG call every attention processor is the one it was, and no diffusers hook is left on the UNet."""
    before = _processors(sd.unet)
    sd.update_components(guider=pag(guidance_scale=7.5))
    run(sd)
    after = _processors(sd.unet)
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)
    assert hooked_modules(sd.unet) == []


def test_pag_puts_the_processors_back_when_the_pass_fails(sd):
    """A UNet pass that raises inside PAG's batch leaves the original processors in place; the next call works."""
    before = _processors(sd.unet)
    expected = run(sd)
    sd.update_components(guider=pag(guidance_scale=7.5))
    seen = []

    def fail(module, args):
        seen.append(type(module.processor).__name__)
        raise RuntimeError("boom")

    attention = sd.unet.get_submodule(MID)[0].attn1
    handle = attention.register_forward_pre_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            run(sd)
    finally:
        handle.remove()
    assert seen == ["PAGCFGIdentitySelfAttnProcessor2_0"]  # it failed while PAG's processor was in place
    after = _processors(sd.unet)
    assert all(after[name] is before[name] for name in before)
    sd.update_components(guider=ClassifierFreeGuidance(guidance_scale=7.5))
    assert torch.equal(run(sd), expected)


def test_pag_on_sdxl_equals_the_classic_pag_pipeline(sdxl):
    """PerturbedAttentionGuidance on SDXL equals StableDiffusionXLPAGPipeline (pag_applied_layers=['mid'])."""
    names = ("vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "scheduler")
    classic = StableDiffusionXLPAGPipeline(
        **{name: sdxl.components[name] for name in names}, add_watermarker=False, pag_applied_layers=["mid"]
    )
    classic.set_progress_bar_config(disable=True)
    inputs = {
        "prompt": "a cat",
        "num_inference_steps": STEPS,
        "output_type": "latent",
        "height": 64,
        "width": 64,
    }
    theirs = classic(generator=seeded(0), pag_scale=3.0, **inputs).images
    sdxl.update_components(guider=pag(indices=(0, 1), guidance_scale=5.0))
    ours = run(sdxl, height=64, width=64)
    assert torch.equal(ours, theirs)


# ----- APG and skip-layer guidance against the peer -----


@pytest.fixture(scope="module")
def peer(sdxl_repo):
    """diffusers' own modular SDXL pipeline on the tiny repo."""
    pipe = PeerSDXLBlocks().init_pipeline(str(sdxl_repo))
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _slg() -> SkipLayerGuidance:
    config = LayerSkipConfig(indices=[0], fqn=MID, skip_attention=True, skip_ff=True)
    return SkipLayerGuidance(
        guidance_scale=5.0,
        skip_layer_guidance_scale=2.0,
        skip_layer_guidance_start=0.0,
        skip_layer_guidance_stop=1.0,
        skip_layer_config=config,
    )


GUIDERS = {
    "apg": (
        lambda: AdaptiveProjectedGuidance(guidance_scale=5.0, adaptive_projected_guidance_momentum=-0.5),
        ATOL,
    ),
    # One pass per condition on both sides: the same batches, bit for bit.
    "slg": (_slg, 0.0),
}


@pytest.mark.parametrize("name", list(GUIDERS))
def test_apg_and_slg_on_sdxl_equal_the_peers_modular_pipeline(sdxl, peer, name):
    """APG (to 1e-4: batched conditions vs the peer's one pass each) and SLG (bit for bit) equal the peer."""
    make, atol = GUIDERS[name]
    inputs = {"prompt": "a cat", "num_inference_steps": STEPS, "height": 64, "width": 64}
    peer.update_components(guider=make())
    theirs = peer(generator=seeded(0), output="latents", **inputs)
    plain = sdxl(generator=seeded(0), output="latents", **inputs)
    sdxl.update_components(guider=make())
    ours = sdxl(generator=seeded(0), output="latents", **inputs)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)
    assert (ours - plain).abs().max() > ATOL  # the guider changed the result beyond the tolerance


# ----- sharing and offload -----


def test_swapping_the_guider_changes_only_that_pipeline(sd_repo):
    """Two pipelines on one manager share the UNet; a guider swapped on one leaves the other's calls as they were."""
    cm = ComponentsManager()
    first, second = load(StableDiffusionAutoBlocks, sd_repo, cm), load(StableDiffusionAutoBlocks, sd_repo, cm)
    assert first.unet is second.unet and first.guider is not second.guider
    expected = run(second)
    first.update_components(guider=pag(guidance_scale=7.5))
    assert type(second.guider) is ClassifierFreeGuidance
    assert torch.equal(run(second), expected)
    assert not torch.equal(run(first), expected)
    assert torch.equal(run(second), expected)


def test_pag_under_auto_offload_equals_pag_without(sd_repo):
    """PAG's attention hooks and the offload hook coexist: with evictions forced, the result is bit-equal."""
    cm = ComponentsManager()
    pipe = load(StableDiffusionAutoBlocks, sd_repo, cm)
    pipe.update_components(guider=pag(guidance_scale=7.5))
    expected = run(pipe, output_type="np")  # decoded: the VAE must make room too
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    try:
        assert run(pipe, output_type="np").tobytes() == expected.tobytes()
        # Models made room, whole or down to a resident prefix (offload.partial.shrink, on by default).
        assert any(entry.evicted or entry.reason == "shrink" for entry in cm.offload_log)
        assert hooked_modules(pipe.unet) == []
    finally:
        cm.disable_auto_cpu_offload()


# ----- bad guiders -----


def test_a_non_guider_is_refused_and_the_guider_kept(sd):
    """update_components(guider=<not a guider>) is a TypeError naming the accepted class; nothing changes."""
    guider = sd.guider
    with pytest.raises(
        TypeError, match=r"^update_components: 'guider' must be a BaseGuidance \(got a str\)$"
    ):
        sd.update_components(guider="cfg")
    assert sd.guider is guider


def test_pag_on_layers_the_unet_lacks_fails_before_any_pass_and_hooks_nothing(sd):
    """A PAG guider naming missing layers is a ValueError naming them and the fix; the UNet is left unhooked."""
    expected = run(sd)
    missing = LayerSkipConfig(
        indices=[5], fqn=MID, skip_attention=False, skip_attention_scores=True, skip_ff=False
    )
    sd.update_components(guider=PerturbedAttentionGuidance(perturbed_guidance_config=missing))
    calls = []
    handle = sd.unet.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(
            ValueError, match=r"perturbs layers \[5\] of 'mid_block.attentions.0.transformer_blocks'"
        ):
            run(sd)
    finally:
        handle.remove()
    assert calls == [] and hooked_modules(sd.unet) == []
    sd.update_components(guider=ClassifierFreeGuidance(guidance_scale=7.5))
    assert torch.equal(run(sd), expected)


def test_a_guider_the_denoiser_cannot_serve_is_refused_and_the_guider_kept(sd):
    """LTX2Guidance asks for predictions SD's denoiser cannot make: a ValueError saying which, nothing changed."""
    guider = sd.guider
    with pytest.raises(
        ValueError,
        match=r"^StableDiffusionLoopDenoiser: LTX2Guidance asks for predictions \['pred_cond_stg', "
        r"'pred_cond_modality'\], which this denoiser cannot make",
    ):
        sd.update_components(guider=LTX2Guidance(guidance_scale=3.0, stg_scale=1.0))
    assert sd.guider is guider


def test_a_layer_config_with_an_int_index_says_how_to_fix_it(sd):
    """SkipLayerGuidance(skip_layer_guidance_layers=[0]) makes an int index diffusers' hook cannot use: the call
    says to give a list, before any pass runs, and hooks nothing."""
    config = LayerSkipConfig(indices=0, fqn=MID)
    sd.update_components(guider=SkipLayerGuidance(skip_layer_config=config))
    with pytest.raises(ValueError, match=r"indices 0, which diffusers' layer-skip hook needs as a list"):
        run(sd)
    assert hooked_modules(sd.unet) == []


def test_auto_layers_on_a_unet_ask_for_named_layers(sd):
    """fqn='auto' finds only transformer blocks; on a UNet the error says to name them."""
    sd.update_components(guider=PerturbedAttentionGuidance(perturbed_guidance_layers=[0]))
    with pytest.raises(
        ValueError, match=r"fqn='auto'.*UNet2DConditionModel.*'mid_block.attentions.0.transformer_blocks'"
    ):
        run(sd)
    assert hooked_modules(sd.unet) == []


def test_a_family_without_a_guider_refuses_one(tmp_path):
    """Flux keeps its own guidance (distilled, true CFG): it has no guider, and giving one is a KeyError."""
    from blocks.flux import FluxAutoBlocks
    from blocks.flux import make_tiny_repo as make_flux_repo

    pipe = FluxAutoBlocks().init_pipeline(make_flux_repo(tmp_path / "tiny-flux"))
    with pytest.raises(KeyError, match=r"no component or config named 'guider'"):
        pipe.update_components(guider=ClassifierFreeGuidance())
    assert "guider" not in pipe.component_names
