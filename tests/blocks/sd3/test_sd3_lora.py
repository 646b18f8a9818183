"""LoRA through our SD3 pipeline, bit for bit with StableDiffusion3Pipeline's own loader."""

import pytest
from diffusers import StableDiffusion3Pipeline

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
from .conftest import SD3

INPUTS = text2image_inputs()

# diffusers' SD3 loader takes a LoRA into the transformer and both CLIP encoders (not T5).
loras = loras_fixture(
    SD3,
    "sd3_repo",
    StableDiffusion3Pipeline,
    {"transformer": DENOISER_TARGETS, "text_encoder": CLIP_TARGETS, "text_encoder_2": CLIP_TARGETS},
)


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(sd3_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    weights = {"transformer": 0.8, "text_encoder": 0.5, "text_encoder_2": 1.2}
    assert_case_matches_classic(
        SD3, sd3_repo, loras, case, weights, ["transformer", "text_encoder", "text_encoder_2"], INPUTS
    )


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_scales_both_clip_encoders_as_the_classic_pipeline(sd3_repo, loras, scale):
    """joint_attention_kwargs={"scale": s} scales the LoRA in the transformer and both CLIP encoders: the
    classic images."""
    assert_scale_matches_classic(SD3, sd3_repo, loras[0], "joint_attention_kwargs", scale, INPUTS)
