"""Per-call overhead of every installed family: ours against its classic pipeline and the peer's modular one.

For each family (the ``modular.blocks`` entry points) a tiny repo is built on the fly; our pipeline loads it,
and the family's first classic pipeline (``FAMILY.classic_pipelines[0]``) and, where the peer has a modular
pipeline of the family (``FAMILY.peer_pipeline_class``), diffusers' ``ModularPipeline`` are built on the very
same component objects. All three run text-to-image with the same prompt, seed and steps, in alternating
rounds (so drifts in machine load hit all alike), and the medians per call are printed with the ratios
ours/classic and ours/peer. Ours must equal classic bit for bit (the run exits 1 otherwise); the peer's largest
difference from ours is printed beside its timing (its defaults differ per family: docs/peer_pipelines.md).

    python benchmarks/family_overhead.py                       # every family, 30 rounds after 5 warm-up
    python benchmarks/family_overhead.py --families flux,z-image --repeats 60

Each call is a text-to-image (Wan: text-to-video) call of ``--steps`` steps decoded to a tensor
(``output_type="pt"``), on one torch thread (spinning threads wait on each other on a shared machine).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import diffusers  # noqa: E402
import torch  # noqa: E402
from diffusers.guiders import ClassifierFreeGuidance  # noqa: E402
from diffusers.modular_pipelines import ModularPipeline as PeerPipeline  # noqa: E402

from benchmarks.overhead import measure  # noqa: E402
from components import ComponentsManager  # noqa: E402
from components.classic import classic_pipeline_kwargs  # noqa: E402
from modular import available_families  # noqa: E402

PROMPT = "a photo of a cat"
# Inputs a family's text-to-image call needs beyond the prompt and its tiny repo's inputs, so that ours, classic
# and the peer do the same work (e.g. the same number of guided passes): SD3's peer guides only with a negative
# prompt given (it encodes no empty one); Qwen-Image's classic pipeline guides only with one, its peer always.
EXTRA_INPUTS: dict[str, dict[str, Any]] = {
    "stable-diffusion-3": {"negative_prompt": "blurry"},
    "qwen-image": {"negative_prompt": "blurry"},
}
# The peer's guiders, by component, at the scale that does what the classic default does
# (docs/peer_pipelines.md): SDXL's peer defaults to 7.5 where classic uses 5.0; Z-Image's peer defaults to no
# guidance, and the classic formula at scale 5.0 is classifier-free guidance at 6.0; Wan's peer guides its two
# experts at 4.0 and 3.0 where classic uses 5.0 for both.
PEER_GUIDANCE: dict[str, dict[str, float]] = {
    "stable-diffusion-xl": {"guider": 5.0},
    "z-image": {"guider": 6.0},
    "wan": {"guider": 5.0, "guider_2": 5.0},
}
# Our (and the peer's) output name and the classic result's attribute, where not "images".
OUTPUTS: dict[str, tuple[str, str]] = {"wan": ("videos", "frames")}


def _seeded() -> torch.Generator:
    return torch.Generator("cpu").manual_seed(0)


def _as_tensor(images: Any) -> torch.Tensor:
    if isinstance(images, torch.Tensor):
        return images.float()
    return torch.as_tensor(images).float()


def runners(
    family: Any, repo: Path, steps: int
) -> tuple[list[tuple[str, Callable[[], Any]]], dict[str, Any]]:
    """One call of ours, of the classic pipeline and (where there is one) of the peer, each returning images."""
    cm = ComponentsManager()
    ours = family.blocks_class().init_pipeline(str(repo), components_manager=cm)
    ours.load_components(torch_dtype=torch.float32)
    ours.set_progress_bar_config(disable=True)
    classic_class = getattr(diffusers, family.classic_pipelines[0])
    # The classic pipeline's own settings (Wan's boundary_ratio, say) as our pipeline read them from the repo.
    settings = inspect.signature(classic_class).parameters
    config = {name: value for name, value in ours.config.items() if name in settings}
    classic = classic_class(**classic_pipeline_kwargs(cm, classic_class), **config)
    classic.set_progress_bar_config(disable=True)
    inputs = {"prompt": PROMPT, "num_inference_steps": steps, "output_type": "pt", **family.tiny_repo_inputs}
    inputs.update(EXTRA_INPUTS.get(family.name, {}))

    output, classic_output = OUTPUTS.get(family.name, ("images", "images"))
    pair: list[tuple[str, Callable[[], Any]]] = [
        ("ours", lambda: ours(generator=_seeded(), output=output, **inputs)),
        ("classic", lambda: getattr(classic(generator=_seeded(), **inputs), classic_output)),
    ]
    if family.peer_pipeline_class != "ModularPipeline":
        peer = PeerPipeline.from_pretrained(str(repo))
        # The peer's own optional components that ours does not hold (e.g. SDXL's image encoder) stay unloaded.
        shared = [name for name in peer.pretrained_component_names if ours.components.get(name) is not None]
        peer.update_components(**{name: ours.components[name] for name in shared})
        guiders = PEER_GUIDANCE.get(family.name, {})
        peer.update_components(
            **{name: ClassifierFreeGuidance(guidance_scale=s) for name, s in guiders.items()}
        )
        pair.append(("peer", lambda: peer(generator=_seeded(), output=output, **inputs)))
    return pair, inputs


def report(name: str, pair: list[tuple[str, Callable[[], Any]]], args: argparse.Namespace) -> bool:
    """Times one family's runners and prints a row; True when ours equals classic bit for bit."""
    outputs = {side: _as_tensor(run()) for side, run in pair}
    equal = torch.equal(outputs["ours"], outputs["classic"])
    medians = measure(pair, args.repeats, args.warmup)
    row = (
        f"{name:<22} ours {medians['ours'] * 1e3:8.2f} ms  classic {medians['classic'] * 1e3:8.2f} ms  "
        f"ours/classic {medians['ours'] / medians['classic']:.3f}  equal: {equal}"
    )
    if "peer" in medians:
        difference = (outputs["ours"] - outputs["peer"]).abs().max().item()
        row += f"  peer {medians['peer'] * 1e3:8.2f} ms  ours/peer {medians['ours'] / medians['peer']:.3f}"
        row += f"  max |ours-peer| {difference:.2e}"
    else:
        row += "  peer: none for this family"
    print(row, flush=True)
    return equal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="", help="comma-separated family names (default: every one)")
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds (one call of each side)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument("--steps", type=int, default=2, help="denoising steps per call")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # diffusers' one-off notices are not part of the measurement

    families = available_families()
    chosen = [name.strip() for name in args.families.split(",") if name.strip()] or sorted(families)
    unknown = [name for name in chosen if name not in families]
    if unknown:
        print(f"unknown families {unknown}; installed: {sorted(families)}", file=sys.stderr)
        return 2
    print(
        f"text-to-image on each family's tiny repo, {args.steps} step(s), output_type='pt', "
        f"{args.repeats} alternating rounds after {args.warmup} warm-up rounds, 1 thread"
    )
    all_equal = True
    with tempfile.TemporaryDirectory() as folder:
        for name in chosen:
            family = families[name]
            repo = family.make_tiny_repo(Path(folder) / name)
            pair, _ = runners(family, repo, args.steps)
            all_equal = report(name, pair, args) and all_equal
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
