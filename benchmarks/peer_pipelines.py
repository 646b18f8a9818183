"""Diffusers' own modular pipelines under our auto offload: bytes moved with the derived plan, without it,
and under the peer's rule.

Run: .venv/bin/python benchmarks/peer_pipelines.py

For the peer's SDXL, Flux, Qwen-Image and Wan pipelines on tiny repos, two text-to-image (video) calls
run on a SimulatedDevice budget that forces evictions: once wrapped in ``PlannedPeerPipeline`` (plan
derived from the peer's block tree), once unwrapped (our engine decides without a plan). The peer's own
``enable_auto_cpu_offload`` refuses a CPU device (no ``mem_get_info``), so its rule (smallest sufficient
set, victims copied back) is replayed on the planned run's model uses (``offload.engine.replay``). Prints bytes
to the device and back, and the peer rule's host->device bytes over ours.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars of every load and denoising loop
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import diffusers.modular_pipelines.wan.encoders as wan_encoders  # noqa: E402
import torch  # noqa: E402
from diffusers.utils import logging as diffusers_logging  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from components import ComponentsManager  # noqa: E402
from components.peer_pipelines import PlannedPeerPipeline  # noqa: E402
from offload import SimulatedDevice, SmallestSufficientSet, module_nbytes  # noqa: E402
from offload.engine.replay import UseRecorder, replay  # noqa: E402
from tests.components.test_peer_pipelines import FAMILIES, Family  # noqa: E402  (the tested families)

if not hasattr(wan_encoders, "ftfy"):  # ASCII prompts pass through ftfy unchanged; it is not installed here
    wan_encoders.ftfy = types.SimpleNamespace(fix_text=lambda text: text)

CALLS = 2
SHARES = (2, 4)  # budget: the largest model plus 1/share of the others


def _run(pipe, family: Family) -> None:
    inputs = {"prompt": "a cat", "num_inference_steps": 3, "output_type": "pt", **family.inputs}
    pipe(generator=torch.Generator("cpu").manual_seed(0), output=family.output, **inputs)


def measure(family: Family, repo: Path, share: int) -> dict[str, int]:
    """Bytes each way for one family and budget: ours with and without the plan, the peer's rule replayed."""
    figures: dict[str, int] = {}
    for planned in (True, False):
        cm = ComponentsManager()
        peer = family.blocks().init_pipeline(str(repo), components_manager=cm)
        peer.load_components(dtype=torch.float32)
        sizes = [module_nbytes(m) for m in cm.components.values() if isinstance(m, torch.nn.Module)]
        budget = max(sizes) + (sum(sizes) - max(sizes)) // share
        cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
        pipe = PlannedPeerPipeline(peer, cm) if planned else peer
        with UseRecorder(cm.offload_engine) as recorder:
            for _ in range(CALLS):
                _run(pipe, family)
        log = cm.offload_log
        label = "plan" if planned else "blind"
        figures[f"{label}_h2d"], figures[f"{label}_d2h"] = log.total_bytes_to_device, log.total_bytes_to_host
        if planned:
            rule = replay(
                recorder.events, recorder.sizes, budget, 0, SmallestSufficientSet(), copies_back=True
            )
            figures["peer_h2d"], figures["peer_d2h"] = rule.bytes_to_device, rule.bytes_to_host
            figures["budget"], figures["models"] = budget, sum(sizes)
    return figures


def main() -> None:
    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    torch.set_num_threads(1)
    print(f"{CALLS} calls of 3 steps per run; budget = largest model + 1/share of the others; margin 0")
    header = (
        "family",
        "share",
        "models",
        "budget",
        "h2d plan",
        "h2d no plan",
        "h2d peer rule",
        "d2h ours",
        "d2h peer rule",
        "peer/plan",
    )
    print(" | ".join(f"{h:>13}" for h in header))
    with tempfile.TemporaryDirectory() as scratch:
        for name, family in FAMILIES.items():
            repo = family.make_repo(Path(scratch) / name)
            for share in SHARES:
                f = measure(family, repo, share)
                row = (
                    name,
                    share,
                    f["models"],
                    f["budget"],
                    f["plan_h2d"],
                    f["blind_h2d"],
                    f["peer_h2d"],
                    f["plan_d2h"],
                    f["peer_d2h"],
                    f"{f['peer_h2d'] / f['plan_h2d']:.2f}x",
                )
                print(" | ".join(f"{str(cell):>13}" for cell in row))


if __name__ == "__main__":
    main()
