"""Fixtures for components tests: tiny SD repos on disk and a local hub cache holding them."""

from __future__ import annotations

import shutil

import attrs
import pytest
from huggingface_hub import constants

from blocks.stable_diffusion.tiny import make_tiny_repo

from .hub_cache import add_to_hub_cache

REPO_ID = "org/tiny-sd"


@attrs.frozen
class HubCache:
    """A local hub cache: ``REPO_ID`` with ``main`` (fp16 variant too) and branch ``v2`` (other weights)."""

    path: str
    repo_id: str
    main_commit: str
    v2_commit: str


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory):
    """A tiny SD repo folder (fp32 weights plus an fp16 variant); tests must not change it."""
    return make_tiny_repo(tmp_path_factory.mktemp("tiny") / "repo", variant="fp16")


@pytest.fixture
def repo_copy(tiny_repo, tmp_path):
    """A private copy of the tiny repo that a test may damage."""
    return shutil.copytree(tiny_repo, tmp_path / "repo", symlinks=False)


@pytest.fixture(scope="session")
def _hub_cache(tiny_repo, tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub")
    main = add_to_hub_cache(cache, REPO_ID, tiny_repo, ref="main")
    other = make_tiny_repo(tmp_path_factory.mktemp("tiny_v2") / "repo", seed=7)
    v2 = add_to_hub_cache(cache, REPO_ID, other, ref="v2")
    return HubCache(path=str(cache), repo_id=REPO_ID, main_commit=main, v2_commit=v2)


@pytest.fixture
def hub_cache(_hub_cache, monkeypatch):
    """The local hub cache, made huggingface_hub's default cache for the test, offline."""
    monkeypatch.setenv("HF_HUB_CACHE", _hub_cache.path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", _hub_cache.path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return _hub_cache
