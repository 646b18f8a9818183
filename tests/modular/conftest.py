"""Fixtures the tests of a tiny SD pipeline share; a test file may define its own of the same name."""

import pytest

from blocks.stable_diffusion import make_tiny_repo

from .tiny_lora import tiny_sd_lora


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A tiny SD repo folder (one per test module)."""
    return make_tiny_repo(tmp_path_factory.mktemp("repo") / "tiny-sd")


@pytest.fixture(scope="module")
def lora(repo, tmp_path_factory):
    """A LoRA file for the tiny SD repo's UNet and text encoder (one per test module)."""
    return tiny_sd_lora(repo, tmp_path_factory.mktemp("lora") / "style")


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if any pipeline loads components."""
    from modular.pipeline.pipeline import ModularPipeline

    def refuse(self, *args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ModularPipeline, "load_components", refuse)
