"""LoRA through our SDXL pipeline, bit for bit with StableDiffusionXLPipeline's own loader."""

import pytest
from diffusers import StableDiffusionXLPipeline

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
from .conftest import SDXL

# 32x32 pixels, as the other families' LoRA tests (not the tiny repo's default 64x64): what a LoRA call changes
# does not depend on the size, and each call does a quarter of the work.
INPUTS = text2image_inputs(height=32, width=32)
MODELS = ["unet", "text_encoder", "text_encoder_2"]


loras = loras_fixture(
    SDXL,
    "sdxl_repo",
    StableDiffusionXLPipeline,
    {"unet": DENOISER_TARGETS, "text_encoder": CLIP_TARGETS, "text_encoder_2": CLIP_TARGETS},
)


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(sdxl_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    weights = {"unet": 0.8, "text_encoder": 0.5, "text_encoder_2": 0.3}
    assert_case_matches_classic(SDXL, sdxl_repo, loras, case, weights, MODELS, INPUTS)


def test_one_file_goes_into_the_unet_and_both_text_encoders(sdxl_repo, loras):
    """One file's keys go into the UNet and both text encoders, under one adapter name."""
    pipe = SDXL.load_pipeline(sdxl_repo)
    pipe.load_lora_weights(loras[0], adapter_name="style")
    assert pipe.get_list_adapters() == dict.fromkeys(MODELS, ["style"])


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_scales_both_text_encoders_as_the_classic_pipeline(sdxl_repo, loras, scale):
    """cross_attention_kwargs={"scale": s} scales the LoRA in both text encoders too: the classic images."""
    assert_scale_matches_classic(SDXL, sdxl_repo, loras[0], "cross_attention_kwargs", scale, INPUTS)
