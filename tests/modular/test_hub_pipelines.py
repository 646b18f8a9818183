"""Pipelines from hub repo ids, resolved offline through a local huggingface_hub cache."""

import pytest
import torch
from huggingface_hub import constants

from blocks.stable_diffusion import make_tiny_repo
from modular import ComponentsManager, ModularPipeline
from tests.components.hub_cache import add_to_hub_cache

REPO_ID = "org/tiny-sd"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub")
    add_to_hub_cache(
        cache, REPO_ID, make_tiny_repo(tmp_path_factory.mktemp("main") / "r", variant="fp16"), ref="main"
    )
    add_to_hub_cache(cache, REPO_ID, make_tiny_repo(tmp_path_factory.mktemp("v2") / "r", seed=7), ref="v2")
    return str(cache)


@pytest.fixture
def hub(cache_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", cache_dir)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache_dir)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache_dir


def test_pipeline_from_a_hub_id_loads_a_variant_at_a_revision(hub):
    """from_pretrained('org/name', revision='main') + variant='fp16': load IDs read org/name|unet|fp16|main."""
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(REPO_ID, components_manager=cm, revision="main")
    pipe.load_components(["unet", "vae"], variant="fp16", torch_dtype=torch.float16)
    assert pipe.get_component_spec("unet").load_id == f"{REPO_ID}|unet|fp16|main"
    assert pipe.unet.dtype == torch.float16
    assert f"{REPO_ID}|unet|fp16|main" in cm.table()


def test_another_revision_loads_other_weights(hub):
    """revision='v2' resolves that branch: its weights differ from main's."""
    main = ModularPipeline.from_pretrained(REPO_ID)
    main.load_components(["unet"], torch_dtype=torch.float32)
    v2 = ModularPipeline.from_pretrained(REPO_ID, revision="v2")
    v2.load_components(["unet"], torch_dtype=torch.float32)
    assert v2.get_component_spec("unet").revision == "v2"
    assert not torch.equal(main.unet.conv_in.weight, v2.unet.conv_in.weight)


def test_a_revision_that_does_not_exist_is_a_clear_error(hub):
    """An unknown revision of a cached repo names the repo and the revision."""
    with pytest.raises(FileNotFoundError, match=r"org/tiny-sd at revision 'nope': cannot read"):
        ModularPipeline.from_pretrained(REPO_ID, revision="nope")
