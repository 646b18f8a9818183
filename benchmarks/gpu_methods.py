"""The models, workflows, target device and offload methods that benchmarks/gpu_offload.py times.

Every method gets fresh copies of the same weights, runs the same workflows, and is checked against one
no-offload reference per workflow. ``Target`` holds everything that differs between CUDA and the CPU
smoke run (a ``SimulatedDevice``), so the CPU test runs the same code as the H200 run everywhere else.
"""

from __future__ import annotations

import copy
import gc
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from offload import OffloadEngine, SimulatedDevice, module_nbytes

# The seed's Flux components in bf16 (GB of 1024**3), before --scale.
SIZES_GB = {"clip": 0.23, "t5": 8.87, "transformer": 22.17, "canny": 22.17, "depth": 22.17, "vae": 0.16}
# The seed's three workflows: a name is one call, (name, steps) a denoising loop (steps capped by --steps).
WORKFLOWS: dict[str, list[str | tuple[str, int]]] = {
    "text2img": ["clip", "t5", ("transformer", 28), "vae"],
    "canny": ["clip", "t5", "vae", ("canny", 50), "vae"],
    "depth": ["clip", "t5", "vae", ("depth", 30), "vae"],
}


class Chain(torch.nn.Module):
    """A bf16 stand-in for a model of about ``nbytes``: ``proj_in`` and a ``blocks`` list of square Linears.

    Shaped as a transformer is: the blocks sit in a top-level ``ModuleList``, which is what both our
    ``offload.partial.groups`` and diffusers' block-level group offloading split into groups, and ``proj_in`` is
    the rest (our base group, diffusers' "unmatched" group, whose hook sets up its stream prefetch). A bare
    ``nn.Sequential`` of Linears would give diffusers no blocks: it would move the whole model as one group.

    ``h2d_bytes`` / ``d2h_bytes`` count what ``.to()`` moves (how the peer's managers move models).
    """

    def __init__(self, nbytes: int, width: int, device: torch.device):
        super().__init__()
        layers = chain_nbytes(nbytes, width) // (width * width * 2)

        def linear() -> torch.nn.Linear:
            layer = torch.nn.Linear(width, width, bias=False, dtype=torch.bfloat16, device=device)
            torch.nn.init.normal_(layer.weight, std=width**-0.5)  # keeps activations of order one
            return layer

        self.proj_in = linear()
        self.blocks = torch.nn.ModuleList(linear() for _ in range(layers - 1))
        super().to("cpu")  # built on the device only because random numbers are faster there
        self.nbytes = module_nbytes(self)
        self.h2d_bytes = 0
        self.d2h_bytes = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj_in(x)
        for block in self.blocks:
            x = block(x)
        return torch.nn.functional.layer_norm(x, x.shape[-1:])

    def get_memory_footprint(self) -> int:  # what diffusers' AutoOffloadStrategy asks every model for
        return self.nbytes

    @property
    def device(self) -> torch.device:  # the peer's hooks compare it with their execution device
        return self.proj_in.weight.device

    def to(self, *args, **kwargs):
        before = self.device
        result = super().to(*args, **kwargs)
        if self.device != before:
            if self.device.type == "cpu":
                self.d2h_bytes += self.nbytes
            elif before.type == "cpu":
                self.h2d_bytes += self.nbytes
        return result


def chain_nbytes(nbytes: int, width: int) -> int:
    """The bytes of a ``Chain`` asked for ``nbytes``: whole layers, two at least."""
    layer = width * width * 2
    return max(2, round(nbytes / layer)) * layer


def build(sizes: Mapping[str, int], width: int, device: torch.device) -> dict[str, Chain]:
    """The models, with seeded random weights, on the host (pageable, as loaded models are)."""
    torch.manual_seed(0)
    return {name: Chain(nbytes, width, device) for name, nbytes in sizes.items()}


def fresh(models: Mapping[str, Chain]) -> dict[str, Chain]:
    """Copies with the same bits and zeroed move counters: no method sees another's pinned or hooked weights."""
    copies = copy.deepcopy(dict(models))
    for model in copies.values():
        model.h2d_bytes = model.d2h_bytes = 0
    return copies


def plan_of(workflow: str) -> list[str]:
    """The workflow's model ids in order, loop bodies once (what ``OffloadEngine.set_plan`` takes)."""
    return [use if isinstance(use, str) else use[0] for use in WORKFLOWS[workflow]]


def _uses(workflow: str, steps_cap: int) -> list[tuple[str, int]]:
    return [
        (use, 1) if isinstance(use, str) else (use[0], min(use[1], steps_cap)) for use in WORKFLOWS[workflow]
    ]


@torch.no_grad()  # as pipelines run: weights require grad, and a graph would keep every activation
def run_workflow(
    models: Mapping[str, Chain], workflow: str, x: torch.Tensor, steps_cap: int, device: torch.device
) -> torch.Tensor:
    """Each model's output feeds the next, so any wrong weight anywhere changes the result; returns it on
    the host (which waits for the device, as a pipeline returning an image does)."""
    h = x.to(device)
    for name, steps in _uses(workflow, steps_cap):
        for _ in range(steps):
            h = models[name](h)
    return h.to("cpu")


@torch.no_grad()
def reference(
    models: Mapping[str, Chain], workflow: str, x: torch.Tensor, steps_cap: int, device: torch.device
) -> torch.Tensor:
    """``run_workflow`` without offload: each model moved to ``device`` by hand for its use, then back."""
    h = x.to(device)
    for name, steps in _uses(workflow, steps_cap):
        model = models[name].to(device)
        for _ in range(steps):
            h = model(h)
        model.to("cpu")
    return h.to("cpu")


class Target:
    """Where methods run: CUDA under ``set_per_process_memory_fraction``, or the CPU with our engine on a
    ``SimulatedDevice`` of the cap (weights stay put; the engine decides and counts bytes as on CUDA).

    Args:
        cuda: Run on ``cuda:0``; else on the CPU.
        margin: Bytes kept free for activations under each cap (both managers' ``memory_reserve_margin``).
    """

    def __init__(self, cuda: bool, margin: int):
        self.cuda = cuda
        self.margin = margin
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        self.cap = 0

    def set_cap(self, cap: int) -> None:
        """Free what earlier methods left and cap the device at ``cap`` bytes."""
        gc.collect()
        self.cap = cap
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0), 0)

    def engine(self) -> OffloadEngine:
        """Our engine, with room for weights equal to the cap less the margin."""
        if not self.cuda:
            return OffloadEngine(SimulatedDevice(self.cap), memory_reserve_margin=self.margin)
        engine = OffloadEngine(self.device, memory_reserve_margin=0)
        # The cap limits what PyTorch may allocate while the probe reports the card's free memory: a margin
        # of the difference makes the engine see the cap.
        room = self.cap - self.margin - torch.cuda.memory_allocated(0)
        engine.memory_reserve_margin = max(0, engine.probe.free_bytes() - room)
        return engine

    def peer_margin(self) -> int:
        """The ``memory_reserve_margin`` that makes diffusers' AutoOffloadStrategy (which reads the card's
        free memory) see the cap less our margin."""
        return max(0, torch.cuda.mem_get_info(0)[0] - self.cap + self.margin)

    def start(self) -> None:
        """Start a timed run: the device idle, peak memory reset."""
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(0)

    def peak(self) -> int | None:
        """Peak allocated bytes since ``start`` (None on the CPU: nothing is allocated on a device)."""
        return torch.cuda.max_memory_allocated(0) if self.cuda else None


@dataclass
class Result:
    """One row of the table."""

    method: str
    cap: int  # bytes, as every size below
    wall_s: float = float("nan")
    peak: int | None = None
    h2d: int | None = None
    d2h: int | None = None
    equal: bool = False
    ours: bool = False
    reasons: Counter[str] = field(default_factory=Counter)  # our engine's decisions by reason ("stream", ...)


@dataclass
class Bench:
    """What every method runs: the workflows in ``order``, their inputs and no-offload outputs."""

    target: Target
    inputs: dict[str, torch.Tensor]
    references: dict[str, torch.Tensor]
    order: list[str]
    steps_cap: int

    def timed(
        self,
        result: Result,
        models: Mapping[str, Chain],
        before: Callable[[str], None] = lambda workflow: None,
        after: Callable[[str], None] = lambda workflow: None,
    ) -> Result:
        """Run the workflows with ``before``/``after`` each (inside the timing); fill wall time, peak
        memory, the peer's ``.to()`` bytes and whether every output equals its reference."""
        target = self.target
        target.start()
        start = time.perf_counter()
        outputs = []
        for workflow in self.order:
            before(workflow)
            outputs.append(
                run_workflow(models, workflow, self.inputs[workflow], self.steps_cap, target.device)
            )
            after(workflow)
        result.wall_s = time.perf_counter() - start
        result.peak = target.peak()
        result.h2d = sum(m.h2d_bytes for m in models.values())
        result.d2h = sum(m.d2h_bytes for m in models.values())
        result.equal = all(torch.equal(out, self.references[w]) for w, out in zip(self.order, outputs))
        return result


def ours(bench: Bench, models: dict[str, Chain], label: str, prefetch: bool, shrink: bool = True) -> Result:
    """Our ``OffloadEngine`` (next use; pinned host copies; nothing copied back), a plan per workflow."""
    engine = bench.target.engine()
    engine.prefetch = prefetch
    engine.shrink_victims = shrink
    for name, model in models.items():
        engine.attach(name, model)
    result = bench.timed(
        Result(label, bench.target.cap, ours=True), models, before=lambda w: engine.set_plan(plan_of(w))
    )
    result.h2d = engine.log.total_bytes_to_device
    result.d2h = engine.log.total_bytes_to_host
    if not bench.target.cuda:
        result.peak = engine.peak_resident_bytes  # the simulated device's weights
    result.reasons = Counter(decision.reason for decision in engine.log)
    engine.close()
    return result


def peer_manager(bench: Bench, models: dict[str, Chain], label: str) -> Result:
    """diffusers' ``ComponentsManager.enable_auto_cpu_offload`` (smallest sufficient set, ``.to()`` both ways)."""
    from diffusers.modular_pipelines import ComponentsManager

    manager = ComponentsManager()
    for name, model in models.items():
        manager.add(name, model)
    manager.enable_auto_cpu_offload(
        device=bench.target.device, memory_reserve_margin=bench.target.peer_margin()
    )
    result = bench.timed(Result(label, bench.target.cap), models)
    manager.disable_auto_cpu_offload()
    return result


def peer_model_offload(bench: Bench, models: dict[str, Chain], label: str) -> Result:
    """diffusers' ``enable_model_cpu_offload``, approximated as it is built: accelerate's
    ``cpu_offload_with_hook`` chained over the workflow's models in order, and every model offloaded after
    the call (``maybe_free_model_hooks``)."""
    from accelerate import cpu_offload_with_hook

    hooks: list = []

    def before(workflow: str) -> None:
        hook = None
        for name in dict.fromkeys(plan_of(workflow)):
            _, hook = cpu_offload_with_hook(models[name], bench.target.device, prev_module_hook=hook)
            hooks.append(hook)

    def after(workflow: str) -> None:
        for hook in hooks:
            hook.offload()
            hook.remove()
        hooks.clear()

    return bench.timed(Result(label, bench.target.cap), models, before, after)


def peer_group_offload(bench: Bench, models: dict[str, Chain], label: str) -> Result:
    """diffusers' ``apply_group_offloading`` on every model: block level, one block per group, with
    ``use_stream`` on CUDA (the next block copied on a side stream; ``record_stream`` left at its default).
    Every block is moved in for every call and dropped after, whatever the cap."""
    from diffusers.hooks import apply_group_offloading

    for model in models.values():
        apply_group_offloading(
            model,
            onload_device=bench.target.device,
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            use_stream=bench.target.cuda,  # streams need CUDA; the CPU smoke run checks the rest
        )
    result = bench.timed(Result(label, bench.target.cap), models)
    result.h2d = result.d2h = None  # it moves groups by assigning .data, which .to() counts miss
    return result


Method = Callable[[Bench, dict[str, Chain]], Result]


def run_method(bench: Bench, pristine: Mapping[str, Chain], cap: int, method: Method) -> Result:
    """Cap the device and run ``method`` on fresh copies of the models."""
    bench.target.set_cap(cap)
    models = fresh(pristine)
    try:
        return method(bench, models)
    finally:
        del models
        bench.target.set_cap(cap)  # frees what the method left on the device


def workflow_inputs(order: Sequence[str], tokens: int, width: int) -> dict[str, torch.Tensor]:
    """One seeded bf16 input of ``tokens`` x ``width`` per workflow."""
    return {
        name: torch.randn(1, tokens, width, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
        for i, name in enumerate(dict.fromkeys(order))
    }
