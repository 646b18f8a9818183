"""The command line: ``modular run`` (the main job) and ``modular inspect`` (a pipeline, without weights)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]

DEFAULT_FAMILY = "stable-diffusion"


def _family(name: str):
    from .families import available_families

    families = available_families()
    if name not in families:
        msg = f"unknown family {name!r}; installed families: {sorted(families)}"
        raise SystemExit(msg)
    return families[name]


def _tiny_repo(family_name: str, folder: Path) -> Path:
    family = _family(family_name)
    if family.make_tiny_repo is None:
        msg = f"family {family_name!r} ships no tiny-repo builder; pass --repo"
        raise SystemExit(msg)
    return Path(family.make_tiny_repo(folder))


def run(args: argparse.Namespace) -> int:
    import torch

    from components import ComponentsManager

    from .pipeline import ModularPipeline

    with tempfile.TemporaryDirectory() as scratch:
        repo = args.repo or _tiny_repo(args.family, Path(scratch) / "tiny-repo")
        extra = {} if args.repo else dict(_family(args.family).tiny_repo_inputs)
        manager = ComponentsManager()
        pipe = ModularPipeline.from_pretrained(repo, components_manager=manager, workflow=args.workflow)
        pipe.load_components(torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=args.quiet)
        generator = torch.Generator("cpu").manual_seed(args.seed)
        images = pipe(
            prompt=args.prompt, num_inference_steps=args.steps, generator=generator, output="images", **extra
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, image in enumerate(images):
        path = out / f"{args.family}-seed{args.seed}-{number}.png"
        image.save(path)
        paths.append(path)
    print(manager)
    for path in paths:
        print(f"saved {path}")
    return 0


def inspect(args: argparse.Namespace) -> int:
    from .pipeline import ModularPipeline

    with tempfile.TemporaryDirectory() as scratch:
        repo = args.repo or _tiny_repo(args.family, Path(scratch) / "tiny-repo")
        pipe = ModularPipeline.from_pretrained(repo, workflow=args.workflow)
        print(repr(pipe.blocks))
        print()
        print(pipe.doc)
        print("Components (not loaded):")
        for name in pipe.component_names:
            spec = pipe.get_component_spec(name)
            kind = spec.type_hint.__name__ if spec.type_hint else "?"
            print(f"  {name}: {kind}  load_id={spec.load_id}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modular", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("run", "generate images"),
        ("inspect", "show a pipeline's blocks and components"),
    ):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument(
            "--repo", help="a local folder or hub repo id (default: a tiny random repo built on the fly)"
        )
        sub.add_argument(
            "--family",
            default=DEFAULT_FAMILY,
            help=f"block family for the tiny repo (default {DEFAULT_FAMILY})",
        )
        sub.add_argument("--workflow", help="prune to one named workflow, e.g. text2image")
    run_parser = commands.choices["run"]
    run_parser.add_argument("--prompt", default="a photo of an astronaut riding a horse")
    run_parser.add_argument("--steps", type=int, default=2)
    run_parser.add_argument("--seed", type=int, default=0)
    run_parser.add_argument("--out", default="out", help="folder for the images (default ./out)")
    run_parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _quiet_libraries() -> None:
    """Keep the libraries' own progress bars and advice out of the command's output."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    diffusers_logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "inspect" or args.quiet:
        _quiet_libraries()
    return {"run": run, "inspect": inspect}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
