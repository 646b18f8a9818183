"""Tiny modules of exact byte sizes for offload tests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers import AutoencoderKL

from offload import MemoryProbe


def sized(nbytes: int) -> torch.nn.Linear:
    """A bias-free Linear whose weight is ``nbytes`` bytes of float32 (``nbytes`` divisible by 4)."""
    module = torch.nn.Linear(nbytes // 4, 1, bias=False)
    torch.nn.init.normal_(module.weight, generator=torch.Generator().manual_seed(nbytes))
    return module


def tiny_vae() -> AutoencoderKL:
    """A diffusers AutoencoderKL of a few kilobytes (one block of 8 channels, attention in the mid block)."""
    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(8,),
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        latent_channels=4,
        norm_num_groups=8,
        layers_per_block=1,
        sample_size=16,
    ).eval()


def call(module: torch.nn.Module) -> torch.Tensor:
    """Run ``module`` on a fixed input of the right width."""
    return module(torch.ones(1, module.in_features))


class MetaProbe(MemoryProbe):
    """A probe whose execution device is ``meta``: the ledger really moves tensors, nothing is allocated."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used: dict[str, int] = {}

    @property
    def execution_device(self) -> torch.device:
        return torch.device("meta")

    def free_bytes(self) -> int:
        return self.budget - sum(self.used.values())

    def on_resident(self, model_id: str, nbytes: int) -> None:
        self.used[model_id] = nbytes

    def on_evicted(self, model_id: str) -> None:
        self.used.pop(model_id, None)


#: A Tower's default width, the bytes of one of its groups then (one Linear(WIDTH, WIDTH) with its bias), and
#: an input for it.
WIDTH = 32
GROUP = (WIDTH * WIDTH + WIDTH) * 4
X = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(1))


class Tower(torch.nn.Module):
    """An input layer and ``depth`` blocks in a ModuleList, as a transformer holds its blocks."""

    def __init__(self, depth: int = 8, seed: int = 0, width: int = WIDTH):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = torch.nn.Linear(width, width)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


# The project's packages: the lines ``lines_run`` counts.
_PACKAGES = tuple(
    str(Path(__file__).resolve().parents[2] / name) for name in ("offload", "components", "modular")
)


def lines_run(function: Callable[..., object], *args: object, **kwargs: object) -> int:
    """How many lines of the project's packages ``function(*args, **kwargs)`` runs (every loop pass counts):
    work that grows with the models attached shows as more lines, without timing anything."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def start(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(_PACKAGES) else None

    previous = sys.gettrace()
    sys.settrace(start)
    try:
        function(*args, **kwargs)
    finally:
        sys.settrace(previous)
    return count


def quantized_tower(depth: int, width: int, seed: int = 0) -> Tower:
    """A bfloat16 Tower whose Linear weights torchao quantized to int8 (tensor subclasses, which move by slot)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_  # slow to import: only where used

    tower = Tower(depth=depth, seed=seed, width=width).to(torch.bfloat16)
    quantize_(tower, Int8WeightOnlyConfig())
    return tower


def check_host_copies_fit(engine) -> int:
    """Assert that ``engine``'s host copies held fit its host budget, beyond it only by what is on its
    (simulated) device, whose weights are host memory here. Returns those bytes on the device."""
    on_device = sum(engine.nbytes(model_id) for model_id in engine.resident_ids())
    assert engine.host_tier.held_bytes() <= max(engine.host_tier.budget, on_device)
    return on_device
