"""`modular run` on Qwen-Image: the family's tiny repo, and a repo given by path."""

import numpy as np
import PIL.Image
import torch

from modular.cli.main import main

from .conftest import make_image


def test_run_the_family_makes_an_image_from_its_tiny_repo(tmp_path):
    """`modular run --family qwen-image` writes the tiny repo and saves one 32 x 32 PNG (the family's size)."""
    out = tmp_path / "out"
    assert main(["run", "--family", "qwen-image", "--out", str(out), "--quiet", "--steps", "2"]) == 0
    (png,) = out.glob("*.png")
    assert PIL.Image.open(png).size == (32, 32)


def test_run_a_repo_with_a_negative_prompt_is_what_the_pipeline_makes(qwen_repo, qwen_pipe, tmp_path):
    """`modular run REPO` with a prompt, negative prompt (true CFG), size, steps and seed saves the image our
    pipeline makes with those inputs."""
    out = tmp_path / "out"
    args = ["--prompt", "a cat", "--negative-prompt", "blurry", "--height", "32", "--width", "32"]
    assert (
        main(["run", str(qwen_repo), *args, "--steps", "2", "--seed", "3", "--out", str(out), "--quiet"]) == 0
    )
    (png,) = out.glob("*.png")
    expected = qwen_pipe(
        prompt="a cat",
        negative_prompt="blurry",
        height=32,
        width=32,
        num_inference_steps=2,
        generator=torch.Generator("cpu").manual_seed(3),
        output="images",
    )[0]
    assert np.array_equal(np.asarray(PIL.Image.open(png)), np.asarray(expected))


def test_run_with_an_image_is_image_to_image(qwen_repo, qwen_pipe, tmp_path):
    """`modular run REPO --image PATH` runs image-to-image: the image our pipeline makes from that file."""
    source = tmp_path / "source.png"
    make_image().save(source)
    out = tmp_path / "out"
    args = ["--prompt", "a cat", "--image", str(source), "--height", "32", "--width", "32", "--steps", "3"]
    assert main(["run", str(qwen_repo), *args, "--seed", "1", "--out", str(out), "--quiet"]) == 0
    (png,) = out.glob("*.png")
    expected = qwen_pipe(
        prompt="a cat",
        image=PIL.Image.open(source),
        height=32,
        width=32,
        num_inference_steps=3,
        generator=torch.Generator("cpu").manual_seed(1),
        output="images",
    )[0]
    assert np.array_equal(np.asarray(PIL.Image.open(png)), np.asarray(expected))
