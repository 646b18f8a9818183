"""LoRA through our Qwen-Image pipeline, bit for bit with QwenImagePipeline's own loader."""

import pytest
from diffusers import QwenImagePipeline

from blocks.qwenimage import FAMILY

from ..lora_helpers import (
    CASES,
    DENOISER_TARGETS,
    SCALES,
    assert_case_matches_classic,
    assert_scale_matches_classic,
    loras_fixture,
    text2image_inputs,
)
from .conftest import QWEN_IMAGE, SIZE

INPUTS = text2image_inputs(height=SIZE, width=SIZE, negative_prompt="blurry")

# The transformer is the only model diffusers' Qwen-Image loader takes a LoRA into.
loras = loras_fixture(QWEN_IMAGE, "qwen_repo", QwenImagePipeline, {"transformer": DENOISER_TARGETS})


def test_the_family_names_diffusers_qwen_image_loader():
    """FAMILY's LoRA loader is diffusers' QwenImageLoraLoaderMixin, the classic pipeline's own."""
    from diffusers.loaders import QwenImageLoraLoaderMixin

    assert FAMILY.loader("lora") is QwenImageLoraLoaderMixin
    assert issubclass(QwenImagePipeline, QwenImageLoraLoaderMixin)


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(qwen_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    assert_case_matches_classic(
        QWEN_IMAGE, qwen_repo, loras, case, {"transformer": 0.8}, ["transformer"], INPUTS
    )


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_matches_the_classic_pipeline(qwen_repo, loras, scale):
    """attention_kwargs={"scale": s} scales the transformer's LoRA: the classic images, and the layers' scales
    are as before after the call."""
    assert_scale_matches_classic(QWEN_IMAGE, qwen_repo, loras[0], "attention_kwargs", scale, INPUTS)
