"""trust_remote_code is consent per repo: True covers the pipeline's own repo, never a repo an index points to."""

import json

import diffusers
import pytest
import torch
from safetensors.torch import save_file

from components import ComponentsManager, ComponentSpec, RemoteCodeError
from modular import InputParam, ModularPipeline, ModularPipelineBlocks

MODEL_CODE = """
import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

open({marker!r}, "a").write("ran\\n")


class CustomModel(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, hidden_size=4):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size)
"""


def custom_code_repo(folder, marker):
    """A model folder whose config names its own code (auto_map), which writes ``marker`` when it runs."""
    folder.mkdir(parents=True)
    (folder / "modeling.py").write_text(MODEL_CODE.format(marker=str(marker)))
    config = {
        "_class_name": "CustomModel",
        "auto_map": {"AutoModel": "modeling.CustomModel"},
        "hidden_size": 4,
    }
    (folder / "config.json").write_text(json.dumps(config))
    weights = {"linear.weight": torch.ones(4, 4), "linear.bias": torch.zeros(4)}
    save_file(weights, folder / "diffusion_pytorch_model.safetensors")
    return folder


class UsesCustomModels(ModularPipelineBlocks):
    """Declares two auto-class components: one from the pipeline's repo, one from elsewhere."""

    @property
    def expected_components(self):
        return [
            ComponentSpec("own_model", diffusers.AutoModel),
            ComponentSpec("other_model", diffusers.AutoModel),
        ]

    @property
    def inputs(self):
        return [InputParam("prompt")]

    def __call__(self, components, state):
        return components, state


@pytest.fixture
def repos(tmp_path):
    """A pipeline repo holding one custom-code model, whose index also takes one from another custom-code repo;
    the marker is the other repo's."""
    marker = tmp_path / "other_ran"  # written when the other repo's code runs
    pipeline_repo = tmp_path / "pipeline"
    custom_code_repo(pipeline_repo / "own_model", tmp_path / "own_ran")
    other_repo = custom_code_repo(tmp_path / "other", marker)
    hint = {"type_hint": ["diffusers", "AutoModel"]}
    index = {
        "_class_name": "ModularPipeline",
        "own_model": [None, None, {"subfolder": "own_model", **hint}],
        "other_model": [
            None,
            None,
            {"pretrained_model_name_or_path": str(other_repo), "subfolder": "", **hint},
        ],
    }
    (pipeline_repo / "modular_model_index.json").write_text(json.dumps(index))
    return str(pipeline_repo), str(other_repo), marker


def test_true_does_not_reach_a_component_from_another_repo(repos):
    """load_components(trust_remote_code=True) refuses the other repo's code, names it, and loads nothing."""
    pipeline_repo, other_repo, marker = repos
    cm = ComponentsManager()
    pipe = UsesCustomModels().init_pipeline(pipeline_repo, components_manager=cm)
    with pytest.raises(RemoteCodeError) as info:
        pipe.load_components(trust_remote_code=True)
    assert str(info.value) == (
        f"'{other_repo}' (no subfolder) declares custom code (auto_map {{'AutoModel': 'modeling.CustomModel'}}), "
        f"which runs only with trust_remote_code. trust_remote_code covers only ['{pipeline_repo}'], and consent "
        f"is per repo: code from other repos never runs on it. If you trust '{other_repo}', name it too: "
        f"trust_remote_code=['{pipeline_repo}', '{other_repo}']."
    )
    assert not marker.exists()
    # All or nothing: the own model, loaded first, is not kept either.
    assert pipe.null_component_names == ["own_model", "other_model"]
    assert cm.components == {}


def test_true_covers_the_pipelines_own_repo(repos):
    """trust_remote_code=True loads the custom model that lives in the pipeline's own repo."""
    pipeline_repo, _, marker = repos
    pipe = UsesCustomModels().init_pipeline(pipeline_repo)
    pipe.load_components(["own_model"], trust_remote_code=True)
    assert type(pipe.own_model).__name__ == "CustomModel"
    assert (marker.parent / "own_ran").read_text() == "ran\n"
    assert not marker.exists()


def test_naming_the_other_repo_lets_its_code_run(repos):
    """A list of repos is consent for each of them."""
    pipeline_repo, other_repo, marker = repos
    pipe = UsesCustomModels().init_pipeline(pipeline_repo)
    pipe.load_components(trust_remote_code=[pipeline_repo, other_repo])
    assert type(pipe.other_model).__name__ == "CustomModel"
    assert marker.read_text() == "ran\n"
    assert pipe.other_model._diffusers_load_id == f"{other_repo}||null|null"


def test_without_consent_nothing_runs(repos):
    """With no consent, the first custom-code component is refused with the plain hint, and no code runs."""
    pipeline_repo, _, marker = repos
    pipe = UsesCustomModels().init_pipeline(pipeline_repo)
    with pytest.raises(RemoteCodeError, match=r"Pass trust_remote_code=True if you trust the repo"):
        pipe.load_components()
    assert not marker.exists() and not (marker.parent / "own_ran").exists()


def test_a_pipeline_without_a_repo_passes_true_to_each_components_own_repo(repos):
    """Made from blocks (no repo of its own), True means each component's own repo, as in the peer."""
    _, other_repo, marker = repos

    class Standalone(UsesCustomModels):
        @property
        def expected_components(self):
            return [ComponentSpec("other_model", diffusers.AutoModel, repo=other_repo)]

    pipe = Standalone().init_pipeline()
    pipe.load_components(trust_remote_code=True)
    assert type(pipe.other_model).__name__ == "CustomModel"


@pytest.mark.parametrize("consent", [3, ["ok", 4], {"org/a"}], ids=["int", "list-with-int", "set"])
def test_a_consent_of_the_wrong_kind_is_a_type_error(repos, consent):
    """trust_remote_code that is neither a bool nor repos is refused before anything loads."""
    pipeline_repo, _, marker = repos
    pipe = UsesCustomModels().init_pipeline(pipeline_repo)
    with pytest.raises(
        TypeError, match=r"trust_remote_code must be True/False, a repo id or folder, or a list"
    ):
        pipe.load_components(trust_remote_code=consent)
    assert not marker.exists()
    assert pipe.null_component_names == ["own_model", "other_model"]


def test_an_index_entry_from_another_repo_imports_no_untrusted_library(tmp_path):
    """from_pretrained(trust_remote_code=True) does not import an untrusted library for another repo's entry."""
    (tmp_path / "pipe").mkdir()
    entry = ["collections", "OrderedDict", {"pretrained_model_name_or_path": "org/other", "subfolder": "x"}]
    index = {"_class_name": "ModularPipeline", "other_model": entry}
    (tmp_path / "pipe" / "modular_model_index.json").write_text(json.dumps(index))

    class Blocks(UsesCustomModels):
        @property
        def expected_components(self):
            return [ComponentSpec("other_model")]

    with pytest.raises(RemoteCodeError, match=r"Refusing to import 'OrderedDict' from library 'collections'"):
        Blocks().init_pipeline(str(tmp_path / "pipe"), trust_remote_code=True)
    pipe = Blocks().init_pipeline(str(tmp_path / "pipe"), trust_remote_code=["org/other"])
    assert pipe.get_component_spec("other_model").type_hint.__name__ == "OrderedDict"


def test_a_standalone_spec_load_with_true_trusts_its_own_repo(repos):
    """ComponentSpec.load(trust_remote_code=True) means the spec's own repo."""
    _, other_repo, marker = repos
    model = ComponentSpec("m", diffusers.AutoModel, repo=other_repo).load(trust_remote_code=True)
    assert type(model).__name__ == "CustomModel"
    with pytest.raises(RemoteCodeError, match="trust_remote_code covers only"):
        ComponentSpec("m", diffusers.AutoModel, repo=other_repo).load(trust_remote_code="org/elsewhere")


def test_from_pretrained_accepts_a_list_of_repos(repos):
    """ModularPipeline's constructor takes the same consent shapes."""
    pipeline_repo, other_repo, _ = repos
    pipe = ModularPipeline(UsesCustomModels(), pipeline_repo, trust_remote_code=[other_repo])
    assert pipe.get_component_spec("other_model").pretrained_model_name_or_path == other_repo
