"""One local folder is one load ID however it is spelled; a hub repo id stays a hub repo id."""

from __future__ import annotations

import os

import pytest
from diffusers import UNet2DConditionModel

from components import ComponentsManager, ComponentSpec, get_load_id


@pytest.fixture
def spellings(tiny_repo, tmp_path, monkeypatch):
    """The tiny repo's folder spelled five ways, from a working folder beside it (one is a link to it)."""
    monkeypatch.chdir(tiny_repo.parent)
    link = tmp_path / "linked-repo"
    link.symlink_to(tiny_repo, target_is_directory=True)
    name = tiny_repo.name
    return [name, f"./{name}", f"{name}/", str(tiny_repo), str(link)]


def test_every_spelling_of_a_folder_gives_the_real_path_load_id(spellings, tiny_repo):
    """'repo', './repo', 'repo/', its absolute path and a link to it: one load ID, naming the real path."""
    ids = {ComponentSpec("unet", repo=spelling, subfolder="unet").load_id for spelling in spellings}
    assert ids == {f"{os.path.realpath(tiny_repo)}|unet|null|null"}


def test_one_folders_weights_load_once_whatever_the_spelling(spellings):
    """Loading through the manager with each spelling returns the one model loaded first."""
    cm = ComponentsManager()
    models = [
        cm.get_or_load(ComponentSpec("unet", UNet2DConditionModel, repo=spelling, subfolder="unet"))
        for spelling in spellings
    ]
    assert all(model is models[0] for model in models)
    assert len(cm.get_ids("unet")) == 1
    # A look-up by a load ID spelled the user's way finds it too.
    assert cm.get_one(load_id=f"{spellings[0]}|unet|null|null") is models[0]


def test_a_hub_repo_id_stays_a_hub_repo_id(hub_cache, tmp_path, monkeypatch):
    """A repo id that is no local path keeps its name in the load ID, loaded or not."""
    monkeypatch.chdir(tmp_path)
    spec = ComponentSpec("unet", UNet2DConditionModel, repo=hub_cache.repo_id, subfolder="unet")
    assert spec.load_id == "org/tiny-sd|unet|null|null"
    assert get_load_id(spec.load()) == "org/tiny-sd|unet|null|null"
