"""The seed's scenario at 1/1024 scale: FLUX.1 text-to-image, then Canny and Depth control, one manager.

The seed is the example this project started from (diffusers PR #10572, "introducing components
manager"); ``modular run`` runs this scenario when no repo is given.

Three repos are written the way the real ones are laid out (FLUX.1-dev, FLUX.1-Canny-dev,
FLUX.1-Depth-dev), with models that weigh what the real ones do with GiB read as MiB: a 22 MiB
transformer in each, and an 8.85 MiB T5, a 0.24 MiB CLIP and a 0.17 MiB VAE that the control repos take
from the base repo (their ``modular_model_index.json`` names it), so the manager loads them once.
The device holds 32 MiB (a 32 GiB card at the same scale) with a 3 MiB margin: less than one workflow's
models, so T5 keeps only a prefix of its weights while a transformer runs (its tail leaves; nothing is
copied back), the previous transformer leaves when the next workflow's T5 comes, and the VAE, small and
used by every workflow, stays. CLIP, the smallest model the first call no longer needs, makes room for
its decode once (keeping a sliver) and is back whole for the next workflow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from modular.batch.jobs import Demo, Job

from .control_images import depth_like_map, edge_map
from .tiny import SEED_SCALE_SIZE, make_seed_scale_repo

__all__ = ["BUDGET", "MARGIN", "PROMPT", "seed_scenario"]

MiB = 2**20  # the unit the components table and the offload log print these sizes in
BUDGET = 32 * MiB
"""Bytes of the simulated device: the seed's workflows on a 32 GiB card, at 1/1024."""
MARGIN = 3 * MiB
"""Bytes kept free on it (the peer's default margin, 3GB, at the same scale)."""
PROMPT = "a photo of an astronaut riding a horse"

# The seed's settings for each workflow: steps and guidance.
_TEXT2IMAGE = {"num_inference_steps": 28, "guidance_scale": 3.5}
_CANNY = {"num_inference_steps": 50, "guidance_scale": 30.0}
_DEPTH = {"num_inference_steps": 30, "guidance_scale": 10.0}

_ABOUT = """\
The example of diffusers PR #10572. Three repos shaped like FLUX.1-dev,
FLUX.1-Canny-dev and FLUX.1-Depth-dev at 1/1024 of their size (GiB read as
MiB): a 22 MiB transformer each; the control repos take CLIP, T5, the VAE, the
tokenizers and the scheduler from the base repo, so the manager loads those
once. The device holds 32 MiB with a 3 MiB margin, less than one workflow
needs: watch T5 keep only part of its weights while each transformer runs, the
previous transformer leave, and the VAE stay (CLIP makes room for the first
decode, then is back). The control images are made from the text-to-image
result (edges; a depth-like map)."""


def _control_from(source: str, make: Callable[[Any], Any]) -> Callable[[Mapping[str, np.ndarray]], dict]:
    def derive(images: Mapping[str, np.ndarray]) -> dict:
        return {"control_image": make(images[source][0])}

    return derive


def _control_job(name: str, repo: Path, inputs: dict, make: Callable[[Any], Any]) -> Job:
    """A control workflow's job: its control image is made by `make` from the text-to-image result."""
    return Job(
        name,
        str(repo),
        inputs=inputs,
        seed=42,
        derive=_control_from("text2image", make),
        derives=("control_image",),
    )


def seed_scenario(folder: str | Path) -> Demo:
    """Write the three repos under ``folder`` and return the scenario's jobs and device budget.

    Args:
        folder: Where the repos go (``tiny-flux-dev``, ``tiny-flux-canny-dev``, ``tiny-flux-depth-dev``).

    Returns:
        A ``modular.batch.jobs.Demo``: jobs ``text2image``, ``canny`` and ``depth`` (seed 42 each, the seed's
        steps and guidance, 64x64 images), ``BUDGET`` and ``MARGIN``.
    """
    folder = Path(folder)
    base = make_seed_scale_repo(folder / "tiny-flux-dev", seed=0)
    canny = make_seed_scale_repo(folder / "tiny-flux-canny-dev", control=True, seed=1, shared_from=base)
    depth = make_seed_scale_repo(folder / "tiny-flux-depth-dev", control=True, seed=2, shared_from=base)
    common = {
        "prompt": PROMPT,
        "height": SEED_SCALE_SIZE,
        "width": SEED_SCALE_SIZE,
        "max_sequence_length": 32,  # the T5 tokens a tiny prompt needs (FLUX.1-dev pads to 512)
    }
    jobs = (
        Job("text2image", str(base), inputs={**common, **_TEXT2IMAGE}, seed=42),
        _control_job("canny", canny, {**common, **_CANNY}, edge_map),
        _control_job("depth", depth, {**common, **_DEPTH}, depth_like_map),
    )
    title = "FLUX.1 text-to-image, then Canny and Depth control, on one ComponentsManager"
    return Demo(title=title, jobs=jobs, budget=BUDGET, margin=MARGIN, about=_ABOUT)
