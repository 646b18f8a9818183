"""LoRA through our Stable Diffusion pipeline, bit for bit with StableDiffusionPipeline's own loader."""

import pytest
from diffusers import StableDiffusionPipeline
from safetensors.torch import load_file

from ..helpers import assert_identical
from ..lora_helpers import (
    CASES,
    CLIP_TARGETS,
    DENOISER_TARGETS,
    SCALES,
    assert_case_matches_classic,
    assert_parity_through,
    assert_scale_matches_classic,
    kohya_copy,
    loras_fixture,
    ours_and_classic,
    run,
    same,
    text2image_inputs,
)
from .conftest import SD

INPUTS = text2image_inputs()


loras = loras_fixture(
    SD, "sd_repo", StableDiffusionPipeline, {"unet": DENOISER_TARGETS, "text_encoder": CLIP_TARGETS}
)


@pytest.mark.parametrize("case", CASES)
def test_lora_calls_match_the_classic_pipeline(sd_repo, loras, case):
    """Each LoRA call leaves our images equal to the classic pipeline's after the same call."""
    weights = {"unet": 0.8, "text_encoder": 0.5}
    assert_case_matches_classic(SD, sd_repo, loras, case, weights, ["unet", "text_encoder"], INPUTS)


def test_one_file_goes_into_the_unet_and_the_text_encoder(sd_repo, loras):
    """A LoRA file with UNet and text encoder keys loads into both, under one adapter name."""
    ours = SD.load_pipeline(sd_repo)
    ours.load_lora_weights(loras[0])
    assert ours.get_list_adapters() == {"unet": ["default_0"], "text_encoder": ["default_0"]}
    assert ours.get_active_adapters() == ["default_0"]


def test_a_kohya_file_matches_the_classic_pipeline_and_the_diffusers_file(sd_repo, loras, tmp_path):
    """kohya/A1111 key names are converted by diffusers: same images as the classic loader and as the
    diffusers-format file of the same weights."""
    kohya = kohya_copy(
        loras[0], tmp_path / "kohya", alpha=8.0, prefixes={"unet": "lora_unet", "text_encoder": "lora_te"}
    )
    ours, classic = ours_and_classic(SD, sd_repo)
    images = assert_parity_through(
        ours, classic, [lambda pipe: pipe.load_lora_weights(kohya, adapter_name="k")], INPUTS
    )
    reference = SD.load_pipeline(sd_repo)
    reference.load_lora_weights(loras[0], adapter_name="d")
    assert_identical(images[0], run(reference, INPUTS))


def test_a_state_dict_loads_as_the_classic_pipeline_loads_it(sd_repo, loras):
    """A state dict in memory (no file metadata: alpha taken as the rank) gives the classic loader's images, and
    the caller's dict is left as it was."""
    state_dict = load_file(loras[0] / "pytorch_lora_weights.safetensors")
    keys = list(state_dict)
    ours, classic = ours_and_classic(SD, sd_repo)
    images = assert_parity_through(ours, classic, [lambda pipe: pipe.load_lora_weights(state_dict)], INPUTS)
    assert not same(images[0], run(SD.load_pipeline(sd_repo), INPUTS))
    assert list(state_dict) == keys


@pytest.mark.parametrize("scale", SCALES)
def test_a_lora_scale_scales_the_text_encoder_as_the_classic_pipeline(sd_repo, loras, scale):
    """cross_attention_kwargs={"scale": s} scales the LoRA in the text encoder too: the classic images."""
    assert_scale_matches_classic(SD, sd_repo, loras[0], "cross_attention_kwargs", scale, INPUTS)
