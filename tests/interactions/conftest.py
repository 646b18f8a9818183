"""The files the interaction tests read, made once per session."""

import pytest

from .world import make_files


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    """The tiny repos, LoRA files and IP-Adapters of tests/interactions/world.py."""
    return make_files(tmp_path_factory.mktemp("interactions"))
