"""Loading reads no pickle file without use_pickle=True, whatever the declared type, and stays in its repo."""

import os
import shutil

import diffusers
import pytest
import torch
import transformers
from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
from safetensors.torch import load_file

from components import ComponentLoadError, ComponentSpec, PickleWeightsError
from components.errors import MissingComponentFileError, PipelineTypeError, SubfolderOutsideRepoError


class Trap:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def plant_trap(folder, marker, name="diffusion_pytorch_model.bin"):
    """Replaces a component folder's safetensors with a real torch.save'd .bin that holds the weights and a Trap."""
    folder = os.fspath(folder)
    weights = [n for n in os.listdir(folder) if n.endswith(".safetensors")]
    state = load_file(os.path.join(folder, weights[0])) if weights else {}
    for weight in weights:
        os.remove(os.path.join(folder, weight))
    torch.save({**state, "trap": Trap(marker)}, os.path.join(folder, name))


def poisoned_pipeline_repo(tiny_repo, folder, marker):
    """A copy of the tiny SD repo (a whole pipeline) whose unet holds only a trapped .bin."""
    repo = shutil.copytree(tiny_repo, folder)
    plant_trap(repo / "unet", marker)
    return repo


@pytest.mark.parametrize(
    "pipeline_class",
    [
        diffusers.DiffusionPipeline,
        diffusers.StableDiffusionPipeline,
        diffusers.AutoPipelineForText2Image,
        diffusers.modular_pipelines.ModularPipeline,
    ],
    ids=lambda cls: cls.__name__,
)
@pytest.mark.parametrize("use_pickle", [False, True])
def test_a_pipeline_type_is_refused(tiny_repo, tmp_path, pipeline_class, use_pickle):
    """A spec whose type is a whole pipeline is refused before anything is read, even with use_pickle=True."""
    marker = tmp_path / "marker"
    repo = poisoned_pipeline_repo(tiny_repo, tmp_path / "nested", marker)
    spec = ComponentSpec("unet", pipeline_class, repo=str(repo))
    with pytest.raises(PipelineTypeError) as info:
        spec.load(use_pickle=use_pickle)
    assert str(info.value) == (
        f"Component 'unet' from '{repo}' (no subfolder) is declared as "
        f"{pipeline_class.__module__}.{pipeline_class.__qualname__}, a whole pipeline, not a component: loading "
        f"it would load another repo's components unchecked. Declare the component's own class (e.g. a model, "
        f"scheduler or tokenizer class) or type_hint=None, and load the other pipeline's components through "
        f"its own index."
    )
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert not marker.exists()
    # The trap was live: unpickling the nested .bin runs its code.
    torch.load(repo / "unet" / "diffusion_pytorch_model.bin", weights_only=False)
    assert marker.read_text() == "ran"


def test_our_modular_pipeline_is_refused_as_a_component_type(tiny_repo, tmp_path):
    """This project's ModularPipeline is a pipeline too, and is refused as a component type."""
    from modular import ModularPipeline

    with pytest.raises(
        PipelineTypeError, match="modular.pipeline.pipeline.ModularPipeline, a whole pipeline"
    ):
        ComponentSpec("unet", ModularPipeline, repo=str(tiny_repo)).load()


def test_a_type_without_from_pretrained_is_a_clear_error(tiny_repo):
    """A declared class with no from_pretrained is a ComponentLoadError naming it, not an AttributeError."""
    with pytest.raises(ComponentLoadError) as info:
        ComponentSpec("unet", dict, repo=str(tiny_repo), subfolder="unet").load()
    assert str(info.value) == (
        f"Component 'unet' from '{tiny_repo}' (subfolder 'unet') is declared as builtins.dict, which has no "
        f"from_pretrained to load it with. Declare a class that loads from a repo, or build the component with "
        f"ComponentSpec.create()."
    )


@pytest.mark.parametrize(
    "type_hint",
    [UNet2DConditionModel, diffusers.AutoModel, None],
    ids=["model", "diffusers-AutoModel", "from-config"],
)
def test_pickle_files_in_nested_folders_are_refused(repo_copy, tmp_path, type_hint):
    """A component folder with a pickle file in a nested folder is refused for every type, and nothing runs."""
    marker = tmp_path / "marker"
    nested = repo_copy / "unet" / "extra" / "deeper"
    nested.mkdir(parents=True)
    plant_trap(nested, marker)
    spec = ComponentSpec("unet", type_hint, repo=str(repo_copy), subfolder="unet")
    with pytest.raises(PickleWeightsError) as info:
        spec.load()
    assert str(info.value) == (
        f"'{repo_copy}' (subfolder 'unet') holds pickle files in nested folders "
        f"(['extra/deeper/diffusion_pytorch_model.bin']); pickle files can run code when loaded, so they are "
        f"refused by default. Remove or convert them to safetensors, or pass use_pickle=True if you trust the "
        f"repo."
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("auto_class", "subfolder"),
    [(diffusers.AutoModel, "unet"), (transformers.AutoModel, "text_encoder")],
    ids=["diffusers", "transformers"],
)
def test_auto_classes_are_told_safetensors_only(tiny_repo, monkeypatch, auto_class, subfolder):
    """diffusers' and transformers' AutoModel get use_safetensors=True (and the variant), as models do."""
    calls = []
    real = auto_class.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        calls.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(auto_class, "from_pretrained", classmethod(recording))
    spec = ComponentSpec(subfolder, auto_class, repo=str(tiny_repo), subfolder=subfolder, variant="fp16")
    component = spec.load(torch_dtype=torch.float16)
    assert isinstance(component, torch.nn.Module)
    ((kwargs),) = calls
    assert kwargs["use_safetensors"] is True and kwargs["variant"] == "fp16"


def test_a_model_folder_without_its_config_names_repo_and_subfolder(repo_copy):
    """A model folder with weights but no config.json: MissingComponentFileError naming repo, subfolder, the fix."""
    os.remove(repo_copy / "vae" / "config.json")
    with pytest.raises(MissingComponentFileError) as info:
        ComponentSpec("vae", AutoencoderKL, repo=str(repo_copy), subfolder="vae").load()
    assert str(info.value) == (
        f"'{repo_copy}' (subfolder 'vae') has no config.json (files present: "
        f"['diffusion_pytorch_model.fp16.safetensors', 'diffusion_pytorch_model.safetensors']); AutoencoderKL reads its config from it. Check the repo and "
        f"subfolder, or save the component there again with save_pretrained()."
    )
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ComponentLoadError)


def test_a_model_folder_without_weights_names_repo_and_subfolder(repo_copy):
    """A model folder with config.json but no weight file: MissingComponentFileError naming what is missing."""
    os.remove(repo_copy / "unet" / "diffusion_pytorch_model.safetensors")
    os.remove(repo_copy / "unet" / "diffusion_pytorch_model.fp16.safetensors")
    with pytest.raises(MissingComponentFileError) as info:
        ComponentSpec("unet", repo=str(repo_copy), subfolder="unet").load()
    assert str(info.value) == (
        f"'{repo_copy}' (subfolder 'unet') has no weight file (*.safetensors or, with use_pickle=True, "
        f"*.bin/*.pt/*.pth/*.ckpt); files present: ['config.json']. Check the repo and subfolder, or save the "
        f"component there again with save_pretrained()."
    )


def test_a_scheduler_folder_without_its_config_names_the_file(repo_copy):
    """A scheduler folder without scheduler_config.json names the file it lacks."""
    os.rename(repo_copy / "scheduler" / "scheduler_config.json", repo_copy / "scheduler" / "other.json")
    with pytest.raises(
        MissingComponentFileError, match=r"\(subfolder 'scheduler'\) has no scheduler_config.json"
    ):
        ComponentSpec("scheduler", PNDMScheduler, repo=str(repo_copy), subfolder="scheduler").load()


@pytest.mark.parametrize(
    ("subfolder", "reason"),
    [
        ("../vae", "it has a '..' part"),
        ("unet/../../tiny", "it has a '..' part"),
        ("..\\vae", "it has a '..' part"),
        ("/etc", "it is an absolute path"),
        ("C:\\models", "it names a drive ('C:')"),
    ],
)
def test_a_subfolder_that_leaves_the_repo_is_refused(tiny_repo, subfolder, reason):
    """A subfolder that is absolute or climbs out with '..' is refused before any file is looked at."""
    repo = tiny_repo / "unet"
    with pytest.raises(SubfolderOutsideRepoError) as info:
        ComponentSpec("vae", repo=str(repo), subfolder=subfolder).load()
    assert str(info.value) == (
        f"Repo '{repo}' (subfolder {subfolder!r}): the subfolder must be a folder inside the repo, but {reason}. "
        f"Give the folder that holds the component as the repo (pretrained_model_name_or_path) and a "
        f"subfolder inside it."
    )
