"""The command line: `modular run` (the main job) and `modular inspect`."""

import PIL.Image

from modular.cli import main


def test_run_saves_an_image_from_a_tiny_repo(tmp_path, capsys):
    """`modular run` builds the default tiny repo, generates, saves a PNG and prints the manager."""
    assert main(["run", "--out", str(tmp_path / "out"), "--quiet", "--steps", "1"]) == 0
    images = list((tmp_path / "out").glob("*.png"))
    assert len(images) == 1
    assert PIL.Image.open(images[0]).size == (64, 64)
    printed = capsys.readouterr().out
    assert "UNet2DConditionModel" in printed and f"saved {images[0]}" in printed


def test_inspect_shows_blocks_and_components_without_loading(capsys):
    """`modular inspect` prints the block tree, the doc and each component's load ID."""
    assert main(["inspect", "--workflow", "text2image"]) == 0
    printed = capsys.readouterr().out
    assert "Inputs:" in printed and "prompt" in printed
    assert "unet: UNet2DConditionModel  load_id=" in printed


def test_run_works_for_every_installed_family(tmp_path):
    """`modular run --family X` generates an image for each family registered by entry point."""
    from modular import available_families

    for name, family in available_families().items():
        if family.make_tiny_repo is None:
            continue
        out = tmp_path / name
        assert main(["run", "--family", name, "--out", str(out), "--quiet", "--steps", "1"]) == 0
        assert len(list(out.glob("*.png"))) == 1, name
