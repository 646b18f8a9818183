"""Three Flux-shaped workflows on one CUDA device under a memory cap: ours vs the peer's two offloads.

Models are plain module chains (stacks of bf16 Linear layers with random weights) sized like the
seed's Flux components scaled down by ``--scale`` (default 1/8: CLIP 0.03, T5 1.11, three
transformers 2.77 each, VAE 0.02 GB); building real Flux pipelines would take far longer than the
moves we measure. ``torch.cuda.set_per_process_memory_fraction`` caps the device at ``--budget-gb``
so that the transformers cannot all stay resident. Each method runs text2img, canny, depth, twice:

- ours: ``offload.OffloadEngine`` (next use, pinned host copies, nothing copied back), plan per run;
- diffusers' ``ComponentsManager.enable_auto_cpu_offload`` (smallest sufficient set, ``.to()`` both ways);
- diffusers' ``enable_model_cpu_offload``, approximated the way it is built: accelerate's
  ``cpu_offload_with_hook`` chained over each workflow's models, everything offloaded after each run.

Prints wall time, peak allocated memory and (ours) bytes moved each way. Needs CUDA; about a minute.
Run: ``python benchmarks/gpu_offload.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offload import OffloadEngine, module_nbytes  # noqa: E402
from offload.units import GB  # noqa: E402  (1024**3, as the manager table and the seed print sizes)

SIZES_GB = {"clip": 0.23, "t5": 8.87, "transformer": 22.17, "canny": 22.17, "depth": 22.17, "vae": 0.16}
WORKFLOWS = {
    "text2img": ["clip", "t5", ("transformer", 28), "vae"],
    "canny": ["clip", "t5", "vae", ("canny", 50), "vae"],
    "depth": ["clip", "t5", "vae", ("depth", 30), "vae"],
}
WIDTH = 2048


class Chain(torch.nn.Sequential):
    """A stack of bf16 Linear layers of about ``nbytes``; has the footprint method the peer asks for."""

    def __init__(self, nbytes: int):
        layers = max(1, round(nbytes / (WIDTH * WIDTH * 2)))
        super().__init__(
            *(torch.nn.Linear(WIDTH, WIDTH, bias=False, dtype=torch.bfloat16) for _ in range(layers))
        )
        for layer in self:
            torch.nn.init.normal_(layer.weight, std=WIDTH**-0.5)

    def get_memory_footprint(self) -> int:
        return module_nbytes(self)

    @property
    def device(self) -> torch.device:  # the peer's hook compares it with its execution device
        return next(self.parameters()).device


def build(scale: float) -> dict[str, Chain]:
    torch.manual_seed(0)
    return {name: Chain(int(gb * GB * scale)) for name, gb in SIZES_GB.items()}


def plan_of(workflow: str) -> list[str]:
    return [u if isinstance(u, str) else u[0] for u in WORKFLOWS[workflow]]


def run_workflow(models: dict[str, Chain], workflow: str, steps_cap: int) -> None:
    x = torch.randn(1, 64, WIDTH, dtype=torch.bfloat16)
    for use in WORKFLOWS[workflow]:
        name, steps = (use, 1) if isinstance(use, str) else (use[0], min(use[1], steps_cap))
        for _ in range(steps):
            out = models[name](x.to("cuda"))
    out.float().sum().item()  # wait for the device


def measure(label: str, models, before_run, after_run, order, steps_cap) -> dict:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for workflow in order:
        before_run(workflow)
        run_workflow(models, workflow, steps_cap)
        after_run(workflow)
    torch.cuda.synchronize()
    return {
        "method": label,
        "wall_s": time.perf_counter() - start,
        "peak_gb": torch.cuda.max_memory_allocated() / GB,
    }


def ours(models, budget_margin, order, steps_cap) -> dict:
    engine = OffloadEngine("cuda", memory_reserve_margin=budget_margin)
    for name, model in models.items():
        engine.attach(name, model)
    result = measure(
        "ours (OffloadEngine, NextUse)",
        models,
        lambda w: engine.set_plan(plan_of(w)),
        lambda w: None,
        order,
        steps_cap,
    )
    result.update(h2d_gb=engine.log.total_bytes_to_device / GB, d2h_gb=engine.log.total_bytes_to_host / GB)
    engine.close()
    return result


def peer_manager(models, budget_margin, order, steps_cap) -> dict:
    from diffusers.modular_pipelines import ComponentsManager

    cm = ComponentsManager()
    for name, model in models.items():
        cm.add(name, model)
    cm.enable_auto_cpu_offload(device="cuda", memory_reserve_margin=budget_margin)
    result = measure("diffusers ComponentsManager", models, lambda w: None, lambda w: None, order, steps_cap)
    cm.disable_auto_cpu_offload()
    for model in models.values():
        model.to("cpu")
    return result


def peer_model_offload(models, order, steps_cap) -> dict:
    from accelerate import cpu_offload_with_hook

    hooks: list = []

    def before(workflow):
        hook = None
        for name in dict.fromkeys(plan_of(workflow)):
            _, hook = cpu_offload_with_hook(models[name], "cuda", prev_module_hook=hook)
            hooks.append(hook)

    def after(workflow):  # like maybe_free_model_hooks: everything back to the CPU after each call
        for hook in hooks:
            hook.offload()
            hook.remove()
        hooks.clear()

    return measure("enable_model_cpu_offload (approx.)", models, before, after, order, steps_cap)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1 / 8, help="component sizes relative to Flux bf16")
    parser.add_argument(
        "--budget-gb", type=float, default=5.0, help="device cap via set_per_process_memory_fraction"
    )
    parser.add_argument(
        "--margin-gb", type=float, default=0.5, help="memory_reserve_margin for both managers"
    )
    parser.add_argument("--steps", type=int, default=8, help="loop steps per denoiser (capped)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA; for the decisions without a GPU run benchmarks/offload_traces.py")
        return 1
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(args.budget_gb * GB / total, 0)
    order = ["text2img", "canny", "depth"] * 2
    warm = torch.randn(WIDTH, WIDTH, device="cuda", dtype=torch.bfloat16)
    (warm @ warm).sum().item()  # cuBLAS and the allocator start before the first timed method
    del warm
    models = build(args.scale)
    sizes = ", ".join(f"{n} {module_nbytes(m) / GB:.2f}" for n, m in models.items())
    print(f"components (GB): {sizes}; cap {args.budget_gb} GB, margin {args.margin_gb} GB")
    # The cap limits what PyTorch may allocate, while mem_get_info reports the whole card: give both
    # managers a margin that turns the card's free memory into the cap.
    free_card = torch.cuda.mem_get_info(0)[0]
    margin = int(free_card - args.budget_gb * GB + args.margin_gb * GB)
    results = [
        ours(models, margin, order, args.steps),
        peer_manager(models, margin, order, args.steps),
        peer_model_offload(models, order, args.steps),
    ]
    base = results[0]["wall_s"]
    print(f"{'method':<36} {'wall s':>8} {'x ours':>7} {'peak GB':>8} {'h2d GB':>7} {'d2h GB':>7}")
    for r in results:
        print(
            f"{r['method']:<36} {r['wall_s']:8.2f} {r['wall_s'] / base:7.2f} {r['peak_gb']:8.2f} "
            f"{r.get('h2d_gb', float('nan')):7.2f} {r.get('d2h_gb', float('nan')):7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
