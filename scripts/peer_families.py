"""The peer's families mapped to ours, for ``scripts/peer_suite.py``: the framework names the peer's tests import,
each family's test folder and class names with our counterparts, and the peer's shared test files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The peer's framework names (``diffusers.modular_pipelines``), each this project's ``modular.<name>``.
FRAMEWORK_NAMES = (
    "AutoPipelineBlocks",
    "BlockState",
    "ComponentSpec",
    "ComponentsManager",
    "ConditionalPipelineBlocks",
    "ConfigSpec",
    "InputParam",
    "LoopSequentialPipelineBlocks",
    "ModularPipeline",
    "ModularPipelineBlocks",
    "OutputParam",
    "PipelineState",
    "SequentialPipelineBlocks",
)


@dataclass(frozen=True)
class PeerFamily:
    """One family: its key (our package under ``blocks/``), the peer's test folder, and the peer's names
    of its classes mapped to ours (dotted paths). Every family has one pipeline class, ``ModularPipeline``."""

    name: str
    package: str
    peer_folder: str
    names: Mapping[str, str] = field(default_factory=dict)
    #: A peer test repo id -> (our tiny-repo builder's dotted path, its keywords), where the family's
    #: ``FAMILY.make_tiny_repo`` with no keywords does not fit (another workflow's or model version's repo).
    repos: Mapping[str, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)


FAMILIES: tuple[PeerFamily, ...] = (
    PeerFamily(
        "stable_diffusion_xl",
        "blocks.stable_diffusion_xl",
        "stable_diffusion_xl",
        {
            "StableDiffusionXLAutoBlocks": "blocks.stable_diffusion_xl.StableDiffusionXLAutoBlocks",
            "StableDiffusionXLModularPipeline": "modular.ModularPipeline",
        },
    ),
    PeerFamily(
        "flux",
        "blocks.flux",
        "flux",
        {
            "FluxAutoBlocks": "blocks.flux.FluxAutoBlocks",
            "FluxModularPipeline": "modular.ModularPipeline",
            # "FluxKontextAutoBlocks": no counterpart (we have no Flux Kontext)
            # "FluxKontextModularPipeline": no counterpart
        },
    ),
    PeerFamily(
        "z_image",
        "blocks.z_image",
        "z_image",
        {
            "ZImageAutoBlocks": "blocks.z_image.ZImageAutoBlocks",
            "ZImageModularPipeline": "modular.ModularPipeline",
        },
    ),
    # Added after the first three: our names filled in as each landed. A peer class left out (no counterpart
    # here yet) is the peer's, and the test classes built on it are skipped, saying so.
    PeerFamily(
        "sd3",
        "blocks.sd3",
        "stable_diffusion_3",
        {
            "StableDiffusion3AutoBlocks": "blocks.sd3.StableDiffusion3AutoBlocks",
            "StableDiffusion3ModularPipeline": "modular.ModularPipeline",
        },
    ),
    PeerFamily(
        "flux2",
        "blocks.flux2",
        "flux2",
        {
            "Flux2AutoBlocks": "blocks.flux2.Flux2AutoBlocks",
            "Flux2ModularPipeline": "modular.ModularPipeline",
            "Flux2KleinBaseAutoBlocks": "blocks.flux2.Flux2KleinBaseAutoBlocks",
            "Flux2KleinBaseModularPipeline": "modular.ModularPipeline",
            # "Flux2KleinAutoBlocks": no counterpart (the distilled Klein's own blocks; ours run it through
            # Flux2KleinBaseAutoBlocks, reading is_distilled from the repo)
            # "Flux2KleinModularPipeline": no counterpart
        },
        repos={
            "hf-internal-testing/tiny-flux2-klein-base-modular": ("blocks.flux2.make_tiny_klein_repo", {}),
        },
    ),
    PeerFamily(
        "qwenimage",
        "blocks.qwenimage",
        "qwen",
        {
            "QwenImageAutoBlocks": "blocks.qwenimage.QwenImageAutoBlocks",
            "QwenImageModularPipeline": "modular.ModularPipeline",
            "QwenImageEditAutoBlocks": "blocks.qwenimage.QwenImageEditAutoBlocks",
            "QwenImageEditModularPipeline": "modular.ModularPipeline",
            # "QwenImageEditPlusAutoBlocks": no counterpart (Qwen-Image-Edit-Plus)
            # "QwenImageEditPlusModularPipeline": no counterpart
        },
        repos={
            "hf-internal-testing/tiny-qwenimage-edit-modular": (
                "blocks.qwenimage.tiny.make_tiny_edit_repo",
                {},
            ),
        },
    ),
    PeerFamily(
        "wan",
        "blocks.wan",
        "wan",
        {
            "WanBlocks": "blocks.wan.WanBlocks",
            "WanModularPipeline": "modular.ModularPipeline",
        },
        repos={
            "hf-internal-testing/tiny-wan-modular-pipe": (
                "blocks.wan.tiny.make_tiny_repo",
                {"kind": "wan2.1"},
            )
        },
    ),
)

#: The shared files every family's tests import (paths in the peer's repository).
SHARED_FILES = (
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/testing_utils.py",
    "tests/modular_pipelines/__init__.py",
)
SHARED_FOLDER = "tests/modular_pipelines/testing_utils"
