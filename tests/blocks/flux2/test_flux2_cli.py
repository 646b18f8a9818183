"""`modular run` on Flux.2: the family's tiny repo, and a Flux.2 repo given by path."""

import PIL.Image
import pytest

from modular.cli.main import main


def test_run_family_saves_an_image_from_the_tiny_repo(tmp_path, capsys):
    """`modular run --family flux2` builds the tiny repo, makes one 32x32 image and prints the Flux.2 models."""
    out = tmp_path / "out"
    assert main(["run", "--family", "flux2", "--out", str(out), "--quiet", "--steps", "1"]) == 0
    images = list(out.glob("*.png"))
    assert len(images) == 1
    assert PIL.Image.open(images[0]).size == (32, 32)
    printed = capsys.readouterr().out
    assert "Flux2Transformer2DModel" in printed and f"saved {images[0]}" in printed


@pytest.mark.parametrize(
    ("repo", "saved"),
    [("flux2_repo", "tiny-flux2-seed0-0.png"), ("klein_repo", "tiny-flux2-klein-seed0-0.png")],
    ids=["flux2", "klein"],
)
def test_run_on_a_repo_by_path(request, tmp_path, repo, saved):
    """A Flux2Pipeline or Flux2KleinPipeline repo given by path runs through the flux2 family (Klein's blocks for
    Klein) and saves <repo folder>-seed0-0.png."""
    out = tmp_path / "out"
    command = [
        "run",
        str(request.getfixturevalue(repo)),
        "--out",
        str(out),
        "--quiet",
        "--steps",
        "1",
        "--height",
        "32",
        "--width",
        "32",
    ]
    assert main(command) == 0
    assert sorted(path.name for path in out.glob("*.png")) == [saved]
