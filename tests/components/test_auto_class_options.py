"""A spec whose type_hint is an auto class gets every load option and the safetensors-only rule."""

import diffusers
import pytest
import torch
import transformers

from components import ComponentSpec, PickleWeightsError
from components.importing import is_pipeline_type

from .test_load_safety import plant_trap

AUTO_CLASSES = [(diffusers.AutoModel, "unet"), (transformers.AutoModel, "text_encoder")]
IDS = ["diffusers", "transformers"]


@pytest.mark.parametrize(("auto_class", "subfolder"), AUTO_CLASSES, ids=IDS)
def test_every_option_reaches_the_model_class(tiny_repo, monkeypatch, auto_class, subfolder):
    """dtype, variant, device_map and use_safetensors reach the class the auto class picks, and take effect."""
    spec = ComponentSpec(subfolder, auto_class, repo=str(tiny_repo), subfolder=subfolder, variant="fp16")
    picked = type(spec.load())
    calls = []
    real = picked.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        calls.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(picked, "from_pretrained", classmethod(recording))
    component = spec.load(torch_dtype=torch.float16, device_map="cpu")
    ((kwargs),) = calls
    assert kwargs["use_safetensors"] is True
    assert kwargs["variant"] == "fp16"
    assert kwargs["device_map"] == "cpu"
    assert kwargs["dtype"] == torch.float16
    assert {p.dtype for p in component.parameters()} == {torch.float16}
    assert component._diffusers_load_id == f"{tiny_repo}|{subfolder}|fp16|null"


@pytest.mark.parametrize(("auto_class", "subfolder"), AUTO_CLASSES, ids=IDS)
def test_a_pickle_file_needs_use_pickle(repo_copy, tmp_path, auto_class, subfolder):
    """An auto class reads no .bin without use_pickle=True: refused before the file is opened."""
    marker = tmp_path / "marker"
    name = "diffusion_pytorch_model.bin" if subfolder == "unet" else "pytorch_model.bin"
    plant_trap(repo_copy / subfolder, marker, name)
    spec = ComponentSpec(subfolder, auto_class, repo=str(repo_copy), subfolder=subfolder)
    with pytest.raises(PickleWeightsError, match=r"has only pickle weights \(\['" + name):
        spec.load()
    assert not marker.exists()


def test_auto_model_stays_loadable_after_a_load_from_a_pipeline_repo(tiny_repo):
    """diffusers' AutoModel leaves config_name at model_index.json after a load; it is still not a pipeline."""
    ComponentSpec("unet", diffusers.AutoModel, repo=str(tiny_repo), subfolder="unet").load()
    assert not is_pipeline_type(diffusers.AutoModel)
    vae = ComponentSpec("vae", diffusers.AutoModel, repo=str(tiny_repo), subfolder="vae").load()
    assert type(vae).__name__ == "AutoencoderKL"
