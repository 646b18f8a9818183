"""LoRA through our Flux pipeline, bit for bit with FluxPipeline's own loader."""

import pytest
from diffusers import FluxPipeline

from components.model_info import lora_info

from ..lora_helpers import (
    CASES,
    CLIP_TARGETS,
    DENOISER_TARGETS,
    SCALES,
    assert_case_matches_classic,
    assert_scale_matches_classic,
    loras_fixture,
    text2image_inputs,
)
from .conftest import FLUX

INPUTS = text2image_inputs(height=32, width=32)


loras = loras_fixture(
    FLUX, "flux_repo", FluxPipeline, {"transformer": DENOISER_TARGETS, "text_encoder": CLIP_TARGETS}
)


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(flux_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    weights = {"transformer": 0.8, "text_encoder": 0.5}
    assert_case_matches_classic(
        FLUX, flux_repo, loras, case, weights, ["transformer", "text_encoder"], INPUTS
    )


def test_fuse_lora_fuses_every_model_holding_a_lora(flux_repo, loras):
    """Without components=, fuse_lora fuses the transformer and the text encoder (the classic default is the
    transformer only)."""
    pipe = FLUX.load_pipeline(flux_repo)
    pipe.load_lora_weights(loras[0], adapter_name="a")
    pipe.fuse_lora()
    assert [info["fused"] for info in lora_info(pipe.transformer) + lora_info(pipe.text_encoder)] == [
        True,
        True,
    ]


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_scales_the_text_encoder_as_the_classic_pipeline(flux_repo, loras, scale):
    """joint_attention_kwargs={"scale": s} scales the LoRA in the CLIP text encoder too: the classic images."""
    assert_scale_matches_classic(FLUX, flux_repo, loras[0], "joint_attention_kwargs", scale, INPUTS)
