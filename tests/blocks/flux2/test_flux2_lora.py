"""LoRA through our Flux.2 pipeline, bit for bit with Flux2Pipeline's own loader (Flux2LoraLoaderMixin)."""

import pytest
from diffusers import Flux2Pipeline

from ..helpers import assert_identical
from ..lora_helpers import (
    CASES,
    SCALES,
    assert_case_matches_classic,
    lora_scalings,
    loras_fixture,
    ours_and_classic,
    run,
    same,
    text2image_inputs,
)
from .conftest import FLUX2, SIZE

INPUTS = text2image_inputs(height=SIZE, width=SIZE)

# The single-stream blocks fuse their attention and MLP input projections into to_qkv_mlp_proj; to_k reaches
# the double-stream blocks (as diffusers' own Flux.2 LoRA tests target them). The transformer is the only model
# diffusers' Flux.2 loader takes a LoRA into.
loras = loras_fixture(FLUX2, "flux2_repo", Flux2Pipeline, {"transformer": ["to_qkv_mlp_proj", "to_k"]})


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(flux2_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    assert_case_matches_classic(FLUX2, flux2_repo, loras, case, {"transformer": 0.8}, ["transformer"], INPUTS)


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_matches_the_classic_pipeline(flux2_repo, loras, scale):
    """joint_attention_kwargs={"scale": s} (the classic pipeline's attention_kwargs) scales the transformer's
    LoRA as the classic pipeline does; it changes the images, and leaves every LoRA layer's scale as before."""
    ours, classic = ours_and_classic(FLUX2, flux2_repo)
    for pipe in (ours, classic):
        pipe.load_lora_weights(loras[0], adapter_name="a")
    before = lora_scalings(ours)
    mine = run(ours, {**INPUTS, "joint_attention_kwargs": {"scale": scale}})
    assert_identical(mine, run(classic, {**INPUTS, "attention_kwargs": {"scale": scale}}))
    assert not same(mine, run(ours, INPUTS))
    assert lora_scalings(ours) == before
