"""Loading components from local folders and from a hub cache by repo id, and the errors on bad input."""

import json
import os

import pytest
import torch
from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
from safetensors.torch import load_file
from transformers import CLIPTextModel, CLIPTokenizer

from components import (
    ComponentLoadError,
    ComponentSpec,
    CorruptWeightsError,
    PickleWeightsError,
    RemoteCodeError,
    RepoNotFoundError,
    RevisionNotFoundError,
    SubfolderNotFoundError,
    VariantNotFoundError,
    get_load_id,
    import_type,
    resolve_type_from_folder,
)

CLASSES = {
    "unet": UNet2DConditionModel,
    "vae": AutoencoderKL,
    "text_encoder": CLIPTextModel,
    "tokenizer": CLIPTokenizer,
    "scheduler": PNDMScheduler,
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_type_hint_none_reads_class_from_config(tiny_repo, name):
    """Without a type_hint, the class comes from the folder's config files."""
    component = ComponentSpec(name, repo=str(tiny_repo), subfolder=name).load()
    assert type(component) is CLASSES[name]
    assert get_load_id(component) == f"{tiny_repo}|{name}|null|null"


def test_loaded_weights_equal_the_files(tiny_repo):
    """The loaded VAE holds exactly the weights in its safetensors file."""
    vae = ComponentSpec("vae", AutoencoderKL, repo=str(tiny_repo), subfolder="vae").load()
    saved = load_file(tiny_repo / "vae" / "diffusion_pytorch_model.safetensors")
    state = vae.state_dict()
    assert all(torch.equal(state[key], value) for key, value in saved.items())


def test_variant_and_dtype(tiny_repo):
    """variant='fp16' reads the fp16 files; torch_dtype sets the module dtype."""
    spec = ComponentSpec("unet", UNet2DConditionModel, repo=str(tiny_repo), subfolder="unet", variant="fp16")
    unet = spec.load(torch_dtype=torch.float16)
    assert unet.dtype == torch.float16
    saved = load_file(tiny_repo / "unet" / "diffusion_pytorch_model.fp16.safetensors")
    key = next(iter(saved))
    assert torch.equal(unet.state_dict()[key], saved[key])
    assert get_load_id(unet) == f"{tiny_repo}|unet|fp16|null"


def test_dtype_is_ignored_for_objects_without_weights(tiny_repo):
    """torch_dtype passed for a tokenizer or scheduler does not reach their config."""
    tokenizer = ComponentSpec("tokenizer", repo=str(tiny_repo), subfolder="tokenizer").load(
        torch_dtype=torch.float16
    )
    scheduler = ComponentSpec("scheduler", repo=str(tiny_repo), subfolder="scheduler").load(dtype="float16")
    assert "dtype" not in tokenizer.init_kwargs
    assert "dtype" not in scheduler.config


def test_hub_id_loads_from_cache_offline(hub_cache, tiny_repo):
    """A repo id loads from the local hub cache with HF_HUB_OFFLINE=1; the load ID names the repo id."""
    unet = ComponentSpec("unet", repo=hub_cache.repo_id, subfolder="unet", variant="fp16").load()
    assert get_load_id(unet) == "org/tiny-sd|unet|fp16|null"
    saved = load_file(tiny_repo / "unet" / "diffusion_pytorch_model.fp16.safetensors")
    key = next(iter(saved))
    assert torch.equal(unet.state_dict()[key].half(), saved[key])


def test_hub_revisions_are_distinct(hub_cache):
    """Branch 'v2' and its commit hash load the second revision's weights; main loads the first."""
    spec = ComponentSpec("vae", AutoencoderKL, repo=hub_cache.repo_id, subfolder="vae")
    main = spec.load()
    v2 = spec.load(revision="v2")
    by_commit = spec.load(revision=hub_cache.v2_commit)
    key = "encoder.conv_in.weight"
    assert not torch.equal(main.state_dict()[key], v2.state_dict()[key])
    assert torch.equal(v2.state_dict()[key], by_commit.state_dict()[key])
    assert get_load_id(v2) == "org/tiny-sd|vae|null|v2"
    assert get_load_id(by_commit) == f"org/tiny-sd|vae|null|{hub_cache.v2_commit}"


def test_hub_cache_dir_option(_hub_cache, monkeypatch):
    """cache_dir= points at a cache other than the default one."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", "/nonexistent-cache")
    tokenizer = ComponentSpec("tokenizer", repo=_hub_cache.repo_id, subfolder="tokenizer").load(
        cache_dir=_hub_cache.path
    )
    assert isinstance(tokenizer, CLIPTokenizer)


def test_missing_repo_offline(hub_cache):
    """A repo id that is not cached, offline: RepoNotFoundError naming the repo and the fix."""
    with pytest.raises(RepoNotFoundError) as info:
        ComponentSpec("unet", repo="org/absent", subfolder="unet").load()
    message = str(info.value)
    assert "'org/absent' (subfolder 'unet') is neither a local folder nor in the hub cache" in message
    assert "HF_HUB_OFFLINE=1" in message and "hf download org/absent" in message
    assert isinstance(info.value, FileNotFoundError)


def test_missing_local_folder(tmp_path):
    """A path that does not exist is a RepoNotFoundError naming the folder."""
    missing = tmp_path / "nope" / "deeper"
    with pytest.raises(RepoNotFoundError, match="no such local folder"):
        ComponentSpec("unet", repo=str(missing), subfolder="unet").load()


@pytest.mark.parametrize("source", ["local", "hub"])
def test_missing_subfolder(tiny_repo, hub_cache, source):
    """A subfolder the repo lacks: SubfolderNotFoundError listing the subfolders present."""
    repo = str(tiny_repo) if source == "local" else hub_cache.repo_id
    with pytest.raises(SubfolderNotFoundError) as info:
        ComponentSpec("unet", UNet2DConditionModel, repo=repo, subfolder="transformer").load()
    assert (
        "has no subfolder 'transformer' (subfolders present: ['scheduler', 'text_encoder', 'tokenizer', 'unet', 'vae'])"
        in str(info.value)
    )


def test_variant_without_files(tiny_repo):
    """A variant with no files: VariantNotFoundError listing the variants there are."""
    with pytest.raises(VariantNotFoundError) as info:
        ComponentSpec(
            "unet", UNet2DConditionModel, repo=str(tiny_repo), subfolder="unet", variant="bf16"
        ).load()
    message = str(info.value)
    assert (
        "(subfolder 'unet', variant 'bf16') has no weights for variant 'bf16'; variants present: ['None', 'fp16']"
        in message
    )


def test_only_variant_files_without_variant(repo_copy):
    """Only variant files and no variant asked: the error says which variant to pass."""
    os.remove(repo_copy / "vae" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(VariantNotFoundError, match="has no default weights, only variants \\['fp16'\\]"):
        ComponentSpec("vae", AutoencoderKL, repo=str(repo_copy), subfolder="vae").load()


def test_missing_revision_offline(hub_cache):
    """A revision not in the cache: RevisionNotFoundError listing the cached refs."""
    with pytest.raises(RevisionNotFoundError) as info:
        ComponentSpec("vae", AutoencoderKL, repo=hub_cache.repo_id, subfolder="vae", revision="v9").load()
    message = str(info.value)
    assert (
        "Revision 'v9' of 'org/tiny-sd' (subfolder 'vae', revision 'v9') is not in the hub cache" in message
    )
    assert "Cached refs: ['main', 'v2']" in message


def test_truncated_safetensors(repo_copy):
    """A truncated weight file: CorruptWeightsError naming the file and the fix."""
    path = repo_copy / "vae" / "diffusion_pytorch_model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptWeightsError) as info:
        ComponentSpec("vae", AutoencoderKL, repo=str(repo_copy), subfolder="vae").load()
    assert (
        f"Weight file {path} is truncated: it declares {len(data)} bytes, the file has {len(data) - 100}."
        in str(info.value)
    )
    assert "--force-download" in str(info.value)


def test_truncated_safetensors_header(repo_copy):
    """A file cut inside its header is reported as truncated too."""
    path = repo_copy / "vae" / "diffusion_pytorch_model.safetensors"
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(CorruptWeightsError, match="its header needs"):
        ComponentSpec("vae", AutoencoderKL, repo=str(repo_copy), subfolder="vae").load()


def _make_pickle_only(folder):
    state = load_file(folder / "diffusion_pytorch_model.safetensors")
    torch.save(state, folder / "diffusion_pytorch_model.bin")
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            os.remove(folder / name)
    return state


def test_pickle_only_needs_opt_in(repo_copy):
    """Pickle-only weights are refused unless use_pickle=True, and the error says so."""
    _make_pickle_only(repo_copy / "vae")
    spec = ComponentSpec("vae", AutoencoderKL, repo=str(repo_copy), subfolder="vae")
    with pytest.raises(PickleWeightsError, match="Pass use_pickle=True to load them if you trust the repo"):
        spec.load()


def test_pickle_opt_in_loads(repo_copy):
    """With use_pickle=True the .bin weights load."""
    state = _make_pickle_only(repo_copy / "vae")
    vae = ComponentSpec("vae", AutoencoderKL, repo=str(repo_copy), subfolder="vae").load(use_pickle=True)
    assert torch.equal(vae.state_dict()["encoder.conv_in.weight"], state["encoder.conv_in.weight"])


def test_errors_are_component_load_errors():
    """Every load error is a ComponentLoadError, and a ValueError."""
    for error in (RepoNotFoundError, SubfolderNotFoundError, VariantNotFoundError, RevisionNotFoundError):
        assert issubclass(error, ComponentLoadError) and issubclass(error, ValueError)
    for error in (CorruptWeightsError, PickleWeightsError, RemoteCodeError):
        assert issubclass(error, ComponentLoadError)


@pytest.mark.parametrize(
    ("library", "name", "expected"),
    [
        ("diffusers", "UNet2DConditionModel", UNet2DConditionModel),
        ("transformers", "CLIPTextModel", CLIPTextModel),
        ("stable_diffusion", "StableDiffusionSafetyChecker", None),
    ],
)
def test_import_type_resolves_trusted_libraries(library, name, expected):
    """import_type resolves diffusers, transformers and diffusers pipeline modules."""
    cls = import_type(library, name)
    assert cls.__name__ == name
    if expected is not None:
        assert cls is expected


def test_import_type_refuses_other_libraries():
    """Another library needs trust_remote_code=True."""
    with pytest.raises(RemoteCodeError, match="Refusing to import 'OrderedDict' from library 'collections'"):
        import_type("collections", "OrderedDict")
    assert import_type("collections", "OrderedDict", trust_remote_code=True).__name__ == "OrderedDict"


def test_import_type_unknown_class():
    """An unknown class is a ComponentLoadError naming library and class."""
    with pytest.raises(ComponentLoadError, match="Library 'diffusers' has no class 'NoSuchModel'"):
        import_type("diffusers", "NoSuchModel")


def test_folder_without_config_needs_type_hint(tmp_path):
    """A folder whose configs name no class asks for a type_hint."""
    with pytest.raises(ComponentLoadError, match="Give the spec a type_hint"):
        resolve_type_from_folder(str(tmp_path), "'x' (no subfolder)")


def test_remote_code_refused_without_trust(tmp_path):
    """A config with auto_map is refused without trust_remote_code."""
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "modeling.MyModel"}}))
    with pytest.raises(RemoteCodeError, match="declares custom code"):
        resolve_type_from_folder(str(tmp_path), "'x' (no subfolder)")


def test_hub_fetch_asks_only_for_the_subfolder(hub_cache, monkeypatch):
    """A hub load asks huggingface_hub for the component's subfolder only, with the token and offline flag."""
    import components.repo

    calls = []
    real = components.repo.snapshot_download

    def recording(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return real(repo_id, **kwargs)

    monkeypatch.setattr(components.repo, "snapshot_download", recording)
    ComponentSpec("vae", AutoencoderKL, repo=hub_cache.repo_id, subfolder="vae", revision="v2").load(
        token="hf_x"
    )
    ((repo_id, kwargs),) = calls
    assert repo_id == "org/tiny-sd"
    assert kwargs["allow_patterns"] == ["vae/*"]
    assert "*.bin" in kwargs["ignore_patterns"]
    assert (kwargs["revision"], kwargs["token"], kwargs["local_files_only"]) == ("v2", "hf_x", True)
