"""LoRA through our Wan pipelines, bit for bit with the classic pipelines' own loader (WanLoraLoaderMixin)."""

import pytest
from diffusers import WanPipeline

from ..helpers import STEPS, assert_identical, seeded
from ..lora_helpers import DENOISER_TARGETS, make_lora, same
from .conftest import VIDEO, WAN, _pipe, classic_from

INPUTS = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "np", **VIDEO}


def _videos(pipe):
    if hasattr(pipe, "blocks"):
        return pipe(generator=seeded(0), output="videos", **INPUTS)
    return pipe(generator=seeded(0), **INPUTS).frames


@pytest.fixture(scope="module")
def lora(wan22_repo, tmp_path_factory):
    """A random LoRA on the transformer's attention, saved with WanPipeline.save_lora_weights."""
    pipe = WAN.load_pipeline(wan22_repo)
    folder = tmp_path_factory.mktemp("wan-lora") / "a"
    return make_lora(folder, WanPipeline, {"transformer": (pipe.transformer, DENOISER_TARGETS)})


@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2"])
def test_a_lora_matches_the_classic_loader(request, lora, kind):
    """Loaded, disabled, enabled, unloaded, loaded again, fused and unfused, the LoRA leaves our videos equal to the
    classic pipeline's after each call; on Wan 2.1 the absent transformer_2 is left out (it is not 'not loaded')."""
    repo = request.getfixturevalue(f"{kind.replace('.', '')}_repo")
    ours, classic = _pipe(repo), classic_from(_pipe(repo))
    baseline = _videos(ours)
    steps = [
        lambda pipe: pipe.load_lora_weights(lora, adapter_name="a"),
        lambda pipe: pipe.disable_lora(),
        lambda pipe: pipe.enable_lora(),
        lambda pipe: pipe.unload_lora_weights(),
        lambda pipe: pipe.load_lora_weights(lora, adapter_name="b"),
        lambda pipe: pipe.fuse_lora(lora_scale=0.7, components=["transformer"]),
        lambda pipe: pipe.unfuse_lora(components=["transformer"]),
    ]
    videos = []
    for step in steps:
        step(ours)
        step(classic)
        mine = _videos(ours)
        assert_identical(mine, _videos(classic))
        videos.append(mine)
    assert not same(videos[0], baseline)
    assert same(videos[1], baseline) and same(videos[2], videos[0])
    assert same(videos[3], baseline) and not same(videos[5], videos[4])


def test_a_lora_for_the_low_noise_expert_matches_the_classic_loader(wan22_repo, lora):
    """load_into_transformer_2=True (a family option of WanLoraLoaderMixin) puts the LoRA into transformer_2 alone,
    as the classic loader does: the same videos, and transformer keeps no adapter."""
    ours, classic = _pipe(wan22_repo), classic_from(_pipe(wan22_repo))
    baseline = _videos(ours)
    for pipe in (ours, classic):
        pipe.load_lora_weights(lora, adapter_name="low", load_into_transformer_2=True)
    assert list(ours.transformer_2.peft_config) == ["low"]
    assert not hasattr(ours.transformer, "peft_config")
    mine = _videos(ours)
    assert_identical(mine, _videos(classic))
    assert not same(mine, baseline)
