"""What the interaction tests run on: tiny repos, LoRA and IP-Adapter files made once, and two sides of
the same pipelines on their own managers (the one under test and its shadow, which never offloads).

Every call is tiny (one step, 32x32, one torch thread), so that one operation costs a few tens of
milliseconds and a stateful example of ten operations well under a few seconds.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import diffusers
import torch
import transformers
from diffusers import (
    Flux2Pipeline,
    FluxPipeline,
    QwenImagePipeline,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    WanPipeline,
)

import blocks.flux.tiny as flux_tiny
import blocks.stable_diffusion.tiny as sd_tiny
from blocks.flux import FAMILY as FLUX_FAMILY
from blocks.flux2 import FAMILY as FLUX2_FAMILY
from blocks.qwenimage import FAMILY as QWEN_FAMILY
from blocks.sd3 import FAMILY as SD3_FAMILY
from blocks.wan import FAMILY as WAN_FAMILY
from components import ComponentsManager
from modular import ModularPipeline, register_family

from ..blocks.lora_helpers import CLIP_TARGETS, DENOISER_TARGETS, make_lora

for _family in (FLUX_FAMILY, SD3_FAMILY, FLUX2_FAMILY, QWEN_FAMILY, WAN_FAMILY):
    register_family(_family)  # harmless once the entry points name it
diffusers.utils.logging.disable_progress_bar()  # thousands of tiny loads and saves
transformers.utils.logging.disable_progress_bar()

#: The pipelines an example can run: two Stable Diffusion pipelines on one repo (they share every model
#: through the manager, as two workflows of one repo do), one Flux pipeline, and one of each newer family
#: (SD3, Flux.2, Qwen-Image, Wan video). name -> family. Every example starts with ``BASE_PIPELINES`` and one
#: of ``NEWER_PIPELINES`` drawn (``InteractionMachine.add_a_newer_family``); the others join when a
#: ``remake_pipeline`` draws them, so an example pays for the pipelines it draws, not for all seven.
PIPELINES = {
    "sd_a": "sd",
    "sd_b": "sd",
    "flux": "flux",
    "sd3": "sd3",
    "flux2": "flux2",
    "qwen": "qwen",
    "wan": "wan",
}
BASE_PIPELINES = ("sd_a", "sd_b", "flux")
NEWER_PIPELINES = tuple(name for name in PIPELINES if name not in BASE_PIPELINES)
#: Each family's tiny-repo builder.
REPO_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "sd": sd_tiny.make_tiny_repo,
    "flux": flux_tiny.make_tiny_repo,
    "sd3": SD3_FAMILY.make_tiny_repo,
    "flux2": FLUX2_FAMILY.make_tiny_repo,
    "qwen": QWEN_FAMILY.make_tiny_repo,
    "wan": WAN_FAMILY.make_tiny_repo,
}
DENOISER = {family: "transformer" for family in REPO_BUILDERS} | {"sd": "unet"}
#: The models a family's LoRA files cover: the denoiser, and the CLIP text encoders where the family's loader
#: takes them (SD3's second CLIP too, so that one file goes into three models).
LORA_TARGETS = {
    "sd": {"unet": DENOISER_TARGETS, "text_encoder": CLIP_TARGETS},
    "flux": {"transformer": DENOISER_TARGETS, "text_encoder": CLIP_TARGETS},
    "sd3": {"transformer": DENOISER_TARGETS, "text_encoder_2": CLIP_TARGETS},
    "flux2": {"transformer": ["to_qkv_mlp_proj", "to_k"]},
    "qwen": {"transformer": DENOISER_TARGETS},
    "wan": {"transformer": DENOISER_TARGETS},
}
LORA_WRITER = {
    "sd": StableDiffusionPipeline,
    "flux": FluxPipeline,
    "sd3": StableDiffusion3Pipeline,
    "flux2": Flux2Pipeline,
    "qwen": QwenImagePipeline,
    "wan": WanPipeline,
}
#: What a family's call returns, and the inputs it takes beyond ``CALL``: a video's frames; two steps for
#: Qwen-Image, whose scheduler config (shift_terminal) stretches a single sigma to 0/0 (NaN, classic's too).
OUTPUT = {family: "images" for family in REPO_BUILDERS} | {"wan": "videos"}
CALL_EXTRA: dict[str, dict[str, Any]] = {"wan": {"num_frames": 5}, "qwen": {"num_inference_steps": 2}}
LORA_NAMES = ("a", "b")
IP_WEIGHTS = {"subfolder": "models", "weight_name": "ip-adapter.safetensors"}
CALL = {"prompt": "a cat", "num_inference_steps": 1, "height": 32, "width": 32, "output_type": "pt"}


@attrs.frozen
class Files:
    """The files every example reads: per family its tiny repo, LoRA folders by name, and IP-Adapter repo."""

    repos: Mapping[str, Path]
    loras: Mapping[str, Mapping[str, Path]]
    ip_adapters: Mapping[str, Path]


def make_files(root: Path) -> Files:
    """Write the tiny repos, two random LoRAs per family (over the denoiser and the text encoder) and one
    IP-Adapter per family under ``root``."""
    repos = {family: build(root / family) for family, build in REPO_BUILDERS.items()}
    ip_adapters = {
        "sd": sd_tiny.make_tiny_ip_adapter(root / "ip-sd", repos["sd"]),
        "flux": flux_tiny.make_tiny_ip_adapter(root / "ip-flux", repos["flux"]),
    }
    loras: dict[str, dict[str, Path]] = {}
    for family, repo in repos.items():
        pipe = load_pipeline(repo, ComponentsManager())
        models = {name: (getattr(pipe, name), targets) for name, targets in LORA_TARGETS[family].items()}
        loras[family] = {
            name: make_lora(root / f"lora-{family}-{name}", LORA_WRITER[family], models, seed=seed)
            for seed, name in enumerate(LORA_NAMES)
        }
    return Files(repos, loras, ip_adapters)


def load_pipeline(repo: Path | str, cm: ComponentsManager, **options: Any) -> ModularPipeline:
    """The pipeline of ``repo`` on ``cm``, its components loaded in float32, progress bars off."""
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32, **options)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def has_ip_adapter(pipe: ModularPipeline, family: str) -> bool:
    """Whether the pipeline's denoiser holds IP-Adapter processors (loaded through it or another pipeline)."""
    denoiser = pipe.components.get(DENOISER[family])
    processors = getattr(denoiser, "attn_processors", {}) or {}
    return any(hasattr(proc, "to_k_ip") for proc in processors.values())


def call_inputs(pipe: ModularPipeline, family: str) -> dict[str, Any]:
    """The fixed small call; with image-prompt embeddings when the denoiser holds an IP-Adapter."""
    inputs: dict[str, Any] = {**CALL, **CALL_EXTRA.get(family, {})}
    if has_ip_adapter(pipe, family):
        positive, negative = torch.randn(2, 1, 1, 32, generator=torch.Generator().manual_seed(7))
        inputs.update(ip_adapter_image_embeds=[positive], negative_ip_adapter_image_embeds=[negative])
    return inputs


@attrs.frozen
class Outcome:
    """What an operation or a call gave: a value, or the type of the error it raised (with its message)."""

    value: Any = None
    error: type[BaseException] | None = None
    message: str = ""

    def same_as(self, other: Outcome) -> bool:
        """Equal values (``torch.equal`` for tensors), or errors of the same type."""
        if self.error is not None or other.error is not None:
            return self.error is other.error
        if isinstance(self.value, torch.Tensor) and isinstance(other.value, torch.Tensor):
            return self.value.dtype == other.value.dtype and torch.equal(self.value, other.value)
        return self.value is None and other.value is None

    def __repr__(self) -> str:
        if self.error is not None:
            return f"Outcome(error={self.error.__name__}: {self.message[:300]})"
        if isinstance(self.value, torch.Tensor):
            return f"Outcome(tensor {tuple(self.value.shape)}, sum {self.value.double().sum().item():.6f})"
        return f"Outcome({self.value!r})"


def outcome(operation: Callable[[], Any]) -> Outcome:
    """Run ``operation``; what it returned or the error it raised (``Exception`` only: a failed assertion or
    an interrupt goes through)."""
    try:
        return Outcome(value=operation())
    except AssertionError:
        raise
    except Exception as error:  # noqa: BLE001 - the error is the outcome being compared
        return Outcome(error=type(error), message=str(error))


def generate(pipe: ModularPipeline, family: str) -> torch.Tensor:
    """One seeded call of ``pipe``: the images as a tensor."""
    inputs = call_inputs(pipe, family)
    return pipe(generator=torch.Generator().manual_seed(0), output=OUTPUT[family], **copy.deepcopy(inputs))


class Side:
    """One manager and the pipelines of ``BASE_PIPELINES`` on it (others added by ``make``), each on its
    family's tiny repo.

    The test drives two: the side under test (offload, host budget, devices) and its shadow, which gets
    the same weight-changing operations and never offload. A dropped pipeline's entry is ``None`` until it is
    made again.
    """

    def __init__(self, files: Files) -> None:
        self.files = files
        self.cm = ComponentsManager()
        self.pipes: dict[str, ModularPipeline | None] = {}
        for name in BASE_PIPELINES:
            self.make(name)

    def make(self, name: str) -> None:
        """(Re)make pipeline ``name`` on this side's manager: models registered there are reused."""
        self.pipes[name] = load_pipeline(self.files.repos[PIPELINES[name]], self.cm)

    def drop(self, name: str) -> set[str]:
        """Drop pipeline ``name`` (the last reference, then a garbage collection); returns the ids of the
        components the manager registered with it as owner (its from-config ones), which must be gone."""
        pipe = self.pipes[name]
        assert pipe is not None
        owned = {
            self.cm.get_id(obj)
            for key, obj in pipe.components.items()
            if key in pipe.config_component_names and obj is not None
        }
        # Another live pipeline may have been given the same object (update_components): it keeps it.
        shared = {
            self.cm.get_id(obj)
            for other, live in self.pipes.items()
            if other != name and live is not None
            for obj in live.components.values()
        }
        self.pipes[name] = None
        del pipe
        gc.collect()
        return {component_id for component_id in owned - shared if component_id is not None}

    def live(self) -> dict[str, ModularPipeline]:
        """The pipelines not dropped, by name."""
        return {name: pipe for name, pipe in self.pipes.items() if pipe is not None}

    def outputs(self) -> dict[str, Outcome]:
        """Each live pipeline's outcome of the fixed call."""
        return {
            name: outcome(lambda pipe=pipe, name=name: generate(pipe, PIPELINES[name]))
            for name, pipe in self.live().items()
        }

    def models(self) -> dict[str, torch.nn.Module]:
        """Every model registered in the manager, by id."""
        return {cid: obj for cid, obj in self.cm.components.items() if isinstance(obj, torch.nn.Module)}

    def close(self) -> None:
        """Turn offload off (its spill files go) and drop the pipelines."""
        if self.cm.auto_offload_enabled:
            self.cm.disable_auto_cpu_offload()
        self.pipes.clear()
