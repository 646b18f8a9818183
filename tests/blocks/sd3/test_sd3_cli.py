"""`modular run` on SD3's tiny repo, through the command line."""

import PIL.Image

from modular.cli.main import main


def test_run_family_saves_an_image_from_the_tiny_repo(tmp_path, capsys):
    """`modular run --family stable-diffusion-3` builds the tiny repo, generates a 32x32 image, saves it as a
    PNG and prints the manager's table with the SD3 transformer."""
    out = tmp_path / "out"
    assert main(["run", "--family", "stable-diffusion-3", "--out", str(out), "--quiet", "--steps", "1"]) == 0
    images = list(out.glob("*.png"))
    assert len(images) == 1
    assert PIL.Image.open(images[0]).size == (32, 32)
    printed = capsys.readouterr().out
    assert "SD3Transformer2DModel" in printed and f"saved {images[0]}" in printed
