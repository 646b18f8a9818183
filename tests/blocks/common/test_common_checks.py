"""blocks/common: the input-check helpers and the image processor sized for the loaded VAE."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers.image_processor import VaeImageProcessor

from blocks.common.checks import ImageInfo, InputProblems, check_size, image_info
from blocks.common.vae import processor_for_vae


def test_processor_for_vae_copies_only_when_the_scale_differs():
    """A processor with the VAE's scale is used as it is; another is copied with it, the shared one unchanged."""
    shared = VaeImageProcessor(vae_scale_factor=8, do_normalize=False)
    assert processor_for_vae(shared, 8) is shared
    sized = processor_for_vae(shared, 2, vae_latent_channels=16)
    assert sized is not shared
    assert (sized.config.vae_scale_factor, sized.config.vae_latent_channels) == (2, 16)
    assert sized.config.do_normalize is False  # the rest of the config is kept
    assert (shared.config.vae_scale_factor, shared.config.vae_latent_channels) == (8, 4)


def test_image_info_reads_count_channels_and_size_of_every_layout():
    """PIL images, [H, W, C] / [B, H, W, C] arrays and [C, H, W] / [B, C, H, W] tensors, alone or in lists."""
    rgba = PIL.Image.new("RGBA", (6, 4))
    assert image_info(rgba) == ImageInfo(1, 4, 4, 6, "a PIL image in mode 'RGBA'")
    assert image_info([rgba, rgba]).images == 2
    assert image_info(np.zeros((2, 4, 6, 3))) == ImageInfo(2, 3, 4, 6, "an array of shape (2, 4, 6, 3)")
    assert image_info(np.zeros((4, 6))) == ImageInfo(1, 1, 4, 6, "an array of shape (4, 6)")
    assert image_info(torch.zeros(3, 4, 6)) == ImageInfo(1, 3, 4, 6, "a tensor of shape (3, 4, 6)")
    assert image_info([torch.zeros(2, 3, 4, 6)] * 2).images == 4
    assert image_info(torch.zeros(4, 6)).channels is None
    assert image_info([]) == ImageInfo(0, None, None, None, "an empty list")


def test_problems_raise_once_with_every_message():
    """One problem is raised as it is; several are listed; TypeError only when every problem is a wrong type."""
    problems = InputProblems()
    problems.raise_for("Step")  # nothing to raise
    problems.add("a (str) must be a list", wrong_type=True)
    with pytest.raises(TypeError) as info:
        problems.raise_for("Step")
    assert str(info.value) == "Step: a (str) must be a list"
    problems.add("b (0) must be at least 1")
    with pytest.raises(ValueError) as info:
        problems.raise_for("Step")
    assert str(info.value) == (
        "Step: 2 problems with the inputs:\n  - a (str) must be a list\n  - b (0) must be at least 1"
    )


@pytest.mark.parametrize(
    ("value", "floor", "message"),
    [
        (100, False, "height (100) must be divisible by 8; pass a multiple of 8 such as 96 or 104"),
        (4, False, "height (4) must be divisible by 8; pass a multiple of 8 such as 8"),
        (-8, False, "height (-8) must be positive; pass a multiple of 8 such as 8, or leave height unset"),
        (4, True, "height (4) must be at least 8; pass 8 or more, or leave height unset"),
        (100, True, None),
        (96, False, None),
        (None, False, None),
    ],
)
def test_size_rule(value, floor, message):
    """A size must be a positive multiple; with floor (Flux) a larger non-multiple is accepted, warned about."""
    problems = InputProblems()
    check_size(problems, "height", value, 8, floor=floor)
    assert problems.messages == ([message] if message else [])
