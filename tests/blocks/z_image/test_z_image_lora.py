"""LoRA through our Z-Image pipeline, bit for bit with ZImagePipeline's own loader."""

import pytest
from diffusers import ZImagePipeline

from ..lora_helpers import (
    CASES,
    DENOISER_TARGETS,
    SCALES,
    assert_case_matches_classic,
    assert_scale_matches_classic,
    loras_fixture,
    text2image_inputs,
)
from .conftest import SIZE, Z_IMAGE

INPUTS = text2image_inputs(height=SIZE, width=SIZE)


# The transformer is the only model diffusers' Z-Image loader takes a LoRA into.
loras = loras_fixture(Z_IMAGE, "zimage_repo", ZImagePipeline, {"transformer": DENOISER_TARGETS})


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(zimage_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    assert_case_matches_classic(
        Z_IMAGE, zimage_repo, loras, case, {"transformer": 0.8}, ["transformer"], INPUTS
    )


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_matches_the_classic_pipeline(zimage_repo, loras, scale):
    """joint_attention_kwargs={"scale": s} scales the transformer's LoRA (diffusers' Z-Image loader takes none into
    the text encoder): the classic images."""
    assert_scale_matches_classic(Z_IMAGE, zimage_repo, loras[0], "joint_attention_kwargs", scale, INPUTS)
