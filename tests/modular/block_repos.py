"""Block repos the block-repo tests write: the peer-style sharpen block, a hub cache of it, markers."""

import json
import sys
import textwrap
import threading

import pytest
from huggingface_hub import constants

from modular import ModularPipelineBlocks
from tests.components.hub_cache import add_to_hub_cache

# A block as a user of the peer (diffusers' Modular Diffusers) publishes it: it imports the peer's names.
PEER_SHARPEN = """
import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.modular_pipelines import ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam


class UnsharpMask(ConfigMixin):
    config_name = "unsharp_mask.json"

    @register_to_config
    def __init__(self, amount: float = {amount}):
        pass

    def __call__(self, images, amount):
        blurred = F.avg_pool2d(images, 3, stride=1, padding=1, count_include_pad=False)
        return (images + amount * (images - blurred)).clamp(0, 1)


class SharpenImagesStep(ModularPipelineBlocks):
    @property
    def description(self):
        return "{description}"

    @property
    def expected_components(self):
        return [
            ComponentSpec(
                "unsharp_mask", UnsharpMask, config={{"amount": {amount}}}, default_creation_method="from_config"
            )
        ]

    @property
    def inputs(self):
        return [
            InputParam("images", required=True, description="decoded, with output_type='pt'"),
            InputParam("sharpen_amount", type_hint=float, description="overrides the mask's amount"),
        ]

    @property
    def intermediate_outputs(self):
        return [OutputParam("images", type_hint=torch.Tensor, description="the sharpened images")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        amount = block_state.sharpen_amount
        if amount is None:
            amount = components.unsharp_mask.config.amount
        block_state.images = components.unsharp_mask(block_state.images, amount)
        self.set_block_state(state, block_state)
        return components, state
"""
DESCRIPTION = "Sharpens the decoded images with an unsharp mask"
CONFIG = {
    "_class_name": "SharpenImagesStep",
    "auto_map": {"ModularPipelineBlocks": "block.SharpenImagesStep"},
}


def write_repo(folder, code=None, config=None, files=None):
    """A block repo: block.py (the peer sharpen block unless `code`), modular_config.json, `files` (path: text)."""
    folder.mkdir(parents=True, exist_ok=True)
    if code is None:
        code = PEER_SHARPEN.format(amount=0.5, description=DESCRIPTION)
    (folder / "block.py").write_text(textwrap.dedent(code))
    (folder / "modular_config.json").write_text(json.dumps(CONFIG if config is None else config))
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def loaded_code_modules():
    """Names of the modules that block repos' code registered."""
    return {name for name in sys.modules if name.startswith("modular.remote.code.m")}


def marker_code(marker):
    """Block code that writes `marker` the moment it runs."""
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n" + PEER_SHARPEN.format(
        amount=0.5, description=DESCRIPTION
    )


REPO_ID = "org/sharpen"


@pytest.fixture(scope="module")
def hub_commits(tmp_path_factory):
    """A local hub cache with the sharpen repo: `main` (amount 0.5) and `v2` (amount 2.0)."""
    cache = tmp_path_factory.mktemp("hub")
    main = write_repo(tmp_path_factory.mktemp("main") / "r")
    v2 = write_repo(
        tmp_path_factory.mktemp("v2") / "r", PEER_SHARPEN.format(amount=2.0, description="Sharpens harder")
    )
    commits = {
        "main": add_to_hub_cache(cache, REPO_ID, main),
        "v2": add_to_hub_cache(cache, REPO_ID, v2, ref="v2"),
    }
    return str(cache), commits


@pytest.fixture
def hub(hub_commits, monkeypatch):
    """The hub cache in use, offline; returns the commits by ref."""
    cache, commits = hub_commits
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return commits


def load_within(seconds, folder, **kwargs):
    """``ModularPipelineBlocks.from_pretrained(folder, **kwargs)``'s block or error; a load still running after
    ``seconds`` fails the test (a hang) instead of hanging it."""
    outcome = {}

    def target():
        try:
            outcome["value"] = ModularPipelineBlocks.from_pretrained(folder, **kwargs)
        except BaseException as error:  # handed to the test thread
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds}s: the load hangs"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
