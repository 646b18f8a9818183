"""The command line: ``modular run`` (the main job) and ``modular inspect`` (a pipeline, without weights).

Every error is one line on stderr, ``modular: error: <type>: <message>``, and exit status 2 (130 when
interrupted); ``--debug`` or ``MODULAR_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .families import BlockFamily
    from .pipeline import ModularPipeline

__all__ = ["main"]

DEFAULT_FAMILY = "stable-diffusion"
ERROR_STATUS = 2  # what argparse exits with for a bad argument: one status for every refused run
INTERRUPTED_STATUS = 130  # the shell's status for a command stopped by Ctrl-C (128 + SIGINT)


def _family(name: str) -> BlockFamily:
    from .families import available_families

    families = available_families()
    if name not in families:
        msg = f"unknown family {name!r}; installed families: {sorted(families)}"
        raise ValueError(msg)
    return families[name]


def _tiny_repo(family_name: str, folder: Path) -> Path:
    family = _family(family_name)
    if family.make_tiny_repo is None:
        msg = f"family {family_name!r} ships no tiny-repo builder; pass --repo"
        raise ValueError(msg)
    return Path(family.make_tiny_repo(folder))


def _family_name(pipe: ModularPipeline, fallback: str) -> str:
    """The family of the pipeline that ran (a ``--repo`` need not be of the ``--family`` given)."""
    from .families import family_of_blocks

    family = family_of_blocks(pipe.blocks_class_name)
    return family.name if family is not None else fallback


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
    family_name = _family_name(pipe, args.family)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, image in enumerate(images):
        path = out / f"{family_name}-seed{args.seed}-{number}.png"
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


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        msg = f"must be a positive whole number (got {text!r})"
        raise argparse.ArgumentTypeError(msg) from None
    if value < 1:
        msg = f"must be at least 1 (got {value})"
        raise argparse.ArgumentTypeError(msg)
    return value


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
        sub.add_argument(
            "--debug", action="store_true", help="show the traceback of an error (or set MODULAR_DEBUG=1)"
        )
    run_parser = commands.choices["run"]
    run_parser.add_argument("--prompt", default="a photo of an astronaut riding a horse")
    run_parser.add_argument("--steps", type=positive_int, default=2, help="denoising steps, at least 1")
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


def _one_line(error: BaseException) -> str:
    """``<type>: <first line of the message>``; a KeyError's message without the quotes str() adds."""
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        text = error.args[0]
    else:
        text = str(error)
    lines = text.strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns the exit status (0, 2 for any error, 130 when interrupted)."""
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("MODULAR_DEBUG", "") not in ("", "0")
    try:
        if args.command == "inspect" or args.quiet:
            _quiet_libraries()
        return {"run": run, "inspect": inspect}[args.command](args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("modular: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS
    except Exception as error:  # the command line's one place that turns any error into its one line
        if debug:
            raise
        print(f"modular: error: {_one_line(error)}", file=sys.stderr)
        return ERROR_STATUS


if __name__ == "__main__":
    sys.exit(main())
