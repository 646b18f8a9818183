"""split_load_kwargs: the one place that tells loading fields (and the repo alias) from load options."""

import pathlib

import pytest
import torch
from diffusers import AutoencoderKL

from components import ComponentsManager, ComponentSpec, get_load_id
from components.load_kwargs import LOAD_OPTIONS, split_load_kwargs

ACCEPTED = [
    "pretrained_model_name_or_path",
    "subfolder",
    "variant",
    "revision",
    "repo",
    "torch_dtype",
    "dtype",
    "quantization_config",
    "token",
    "local_files_only",
    "use_pickle",
    "trust_remote_code",
    "cache_dir",
    "device_map",
    "low_cpu_mem_usage",
    "config",
]


def test_splits_fields_from_options():
    """Loading fields go to the first dict, everything else to the second, in the order given."""
    fields, options = split_load_kwargs(
        {
            "torch_dtype": torch.float16,
            "variant": "fp16",
            "token": "t",
            "subfolder": "unet",
            "revision": None,
        },
        "load()",
    )
    assert fields == {"variant": "fp16", "subfolder": "unet", "revision": None}
    assert options == {"torch_dtype": torch.float16, "token": "t"}
    assert list(options) == ["torch_dtype", "token"]


def test_repo_is_an_alias_of_pretrained_model_name_or_path():
    """repo= becomes pretrained_model_name_or_path; both given and equal (a path and its str) is accepted."""
    assert split_load_kwargs({"repo": "org/x"}, "load()") == ({"pretrained_model_name_or_path": "org/x"}, {})
    path = pathlib.Path("/tmp/repo")
    fields, _ = split_load_kwargs({"repo": path, "pretrained_model_name_or_path": "/tmp/repo"}, "load()")
    assert fields == {"pretrained_model_name_or_path": path}


def test_repo_and_its_alias_that_disagree_are_an_error():
    """repo and pretrained_model_name_or_path with different values is a ValueError naming both."""
    with pytest.raises(ValueError) as info:
        split_load_kwargs({"repo": "org/a", "pretrained_model_name_or_path": "org/b"}, "load() for 'vae'")
    assert str(info.value) == (
        "load() for 'vae': repo ('org/a') and pretrained_model_name_or_path ('org/b') disagree; repo is an "
        "alias, pass one of them."
    )


def test_unknown_keyword_names_the_closest_accepted_one():
    """An unknown keyword is a TypeError naming the caller, each unknown key, its closest match, and all accepted."""
    with pytest.raises(TypeError) as info:
        split_load_kwargs(
            {"varaint": "fp16", "zzz": 1, "torch_dtype": None}, "ComponentSpec.load() for 'vae'"
        )
    assert str(info.value) == (
        "ComponentSpec.load() for 'vae' got unknown keyword(s) 'varaint' (did you mean 'variant'?), 'zzz'. "
        f"Accepted: {ACCEPTED}."
    )


def test_every_load_option_is_accepted():
    """Each documented load option passes through as an option."""
    kwargs = dict.fromkeys(LOAD_OPTIONS, None)
    assert split_load_kwargs(kwargs, "load()") == ({}, kwargs)


def test_get_or_load_checks_keywords_before_loading():
    """get_or_load with a misspelled keyword raises before anything loads, and registers nothing."""
    cm = ComponentsManager()
    spec = ComponentSpec("vae", AutoencoderKL, repo="org/not-there", subfolder="vae")
    with pytest.raises(TypeError, match=r"'torch_dtpye' \(did you mean 'torch_dtype'\?\)"):
        cm.get_or_load(spec, torch_dtpye=torch.float32)
    assert len(cm) == 0 and cm._loads._loading == {}


def test_get_or_load_reuses_by_the_overridden_load_id(tiny_repo):
    """Fields passed to get_or_load (repo alias included) decide the load ID that is reused."""
    cm = ComponentsManager()
    spec = ComponentSpec("vae", AutoencoderKL, subfolder="vae")
    vae = cm.get_or_load(spec, repo=str(tiny_repo), torch_dtype=torch.float32)
    assert get_load_id(vae) == f"{tiny_repo}|vae|null|null"
    again = cm.get_or_load(spec, pretrained_model_name_or_path=str(tiny_repo), dtype="float32")
    assert again is vae and len(cm) == 1
