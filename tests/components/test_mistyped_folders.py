"""A local folder typed wrong is reported as a missing folder, not as a hub repo the offline hub cannot give."""

import pytest
from diffusers import UNet2DConditionModel

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentSpec
from components.errors import RepoNotFoundError
from modular import ModularPipeline


@pytest.fixture
def out(tmp_path, monkeypatch):
    """A working folder holding out/tiny-sd, as `modular run` users have."""
    monkeypatch.chdir(tmp_path)
    make_tiny_repo(tmp_path / "out" / "tiny-sd")
    return tmp_path


def test_a_misspelt_folder_beside_its_parent_is_no_such_folder_with_the_closest_name(out):
    """`out/tiny-sdd` (the folder `out` exists): "no such folder", the path and the close name."""
    with pytest.raises(FileNotFoundError) as caught:
        ModularPipeline.from_pretrained("out/tiny-sdd")
    message = str(caught.value)
    assert f"no such folder {out / 'out' / 'tiny-sdd'} (did you mean 'out/tiny-sd'?)" in message
    assert "offline" not in message


def test_a_component_from_a_misspelt_folder_is_no_such_folder(out):
    """The same when a spec names the folder: the load fails before the hub is asked about it."""
    spec = ComponentSpec(
        "unet", UNet2DConditionModel, pretrained_model_name_or_path="out/tiny-sdd", subfolder="unet"
    )
    with pytest.raises(
        RepoNotFoundError, match=r"no such folder .*tiny-sdd \(did you mean 'out/tiny-sd'\?\)"
    ):
        spec.load()


def test_a_hub_id_with_nothing_local_like_it_keeps_the_hub_message(out):
    """`org/model` with no `org` folder and no close name here is a hub id: the message is about the hub."""
    with pytest.raises(FileNotFoundError) as caught:
        ModularPipeline.from_pretrained("someorg/somemodel")
    assert "no such folder" not in str(caught.value) and "offline" in str(caught.value)
