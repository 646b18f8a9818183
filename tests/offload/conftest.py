"""Fixtures shared by the host-tier tests (one device and several)."""

import pytest

from components import ComponentsManager

from .test_host_tier import loaded


@pytest.fixture
def five(tmp_path):
    """Five models loaded from their own safetensors files, registered on a manager."""
    models = [loaded(tmp_path / f"model{i}", i) for i in range(5)]
    cm = ComponentsManager()
    ids = [cm.add(f"model{i}", model) for i, model in enumerate(models)]
    return cm, models, ids
