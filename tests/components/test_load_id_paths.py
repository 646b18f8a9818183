"""One local folder is one load ID however it is spelled; a hub repo id stays a hub repo id."""

from __future__ import annotations

import os

import pytest
from diffusers import UNet2DConditionModel

import components.registry as registry
from components import ComponentsManager, ComponentSpec, get_load_id, tag_load_id
from components.errors import ComponentNotFoundError


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


def test_a_components_tag_is_resolved_once_until_it_changes(tiny_repo, monkeypatch):
    """Look-ups by load ID resolve each registered component's tag to its real path once (a resolution reads
    the filesystem, and a serving replica looks every model up several times a second); a component tagged
    anew is resolved again, so a look-up by its new load ID finds it and one by the old does not."""
    cm = ComponentsManager()
    model = cm.get_or_load(ComponentSpec("unet", UNet2DConditionModel, repo=str(tiny_repo), subfolder="unet"))
    resolved: list[str] = []
    canonical = registry.canonical_load_id
    monkeypatch.setattr(
        registry, "canonical_load_id", lambda load_id: resolved.append(load_id) or canonical(load_id)
    )
    old = f"{tiny_repo}/|unet|null|null"  # the query spelled otherwise than the tag
    for _ in range(3):
        assert cm.get_one(load_id=old) is model
    assert (
        resolved.count(old) == 3 and resolved.count(get_load_id(model)) == 1
    )  # the query each time, the tag once
    tag_load_id(model, f"{tiny_repo}|unet|fp16|null")
    assert cm.get_one(load_id=f"{tiny_repo}|unet|fp16|null") is model
    with pytest.raises(ComponentNotFoundError):
        cm.get_one(load_id=old)
