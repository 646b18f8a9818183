"""Pipelines on one manager load one folder once, however the user or a control repo's index spells it."""

import json

import pytest
import torch

from blocks.stable_diffusion import make_tiny_repo
from modular import ComponentsManager, ModularPipeline
from modular.pipeline.index import MODULAR_INDEX


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_tiny_repo(tmp_path_factory.mktemp("spell") / "tiny-sd")


def _loaded(repo, cm, names=("unet", "vae")):
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(list(names), torch_dtype=torch.float32)
    return pipe


def test_two_spellings_of_one_folder_share_its_models(repo, monkeypatch):
    """'tiny-sd' and './tiny-sd/' on one manager: the second pipeline gets the first one's models."""
    monkeypatch.chdir(repo.parent)
    cm = ComponentsManager()
    first, second = _loaded("tiny-sd", cm), _loaded("./tiny-sd/", cm)
    assert second.unet is first.unet and second.vae is first.vae
    assert len(cm.get_ids("unet")) == 1
    assert first.get_component_spec("unet").load_id == f"{repo.resolve()}|unet|null|null"


def test_a_control_repo_naming_the_base_absolutely_shares_with_a_relative_user(repo, tmp_path, monkeypatch):
    """An index naming the base folder by its absolute path loads what the user loaded as 'tiny-sd' once."""
    control = tmp_path / "control"
    _loaded(repo, ComponentsManager()).save_pretrained(control, overwrite_modular_index=False)
    assert json.loads((control / MODULAR_INDEX).read_text())["unet"][2][
        "pretrained_model_name_or_path"
    ] == str(repo)
    monkeypatch.chdir(repo.parent)
    cm = ComponentsManager()
    user, controlled = _loaded("tiny-sd", cm), _loaded(control, cm)
    assert controlled.unet is user.unet
    assert len(cm.get_ids("unet")) == 1
