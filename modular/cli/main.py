"""The command line: ``modular run`` (the main job), ``modular batch``, ``serve``, ``inspect`` and ``families``.

``modular run`` with no repo runs the built-in scenario: the seed's three FLUX.1 workflows (text-to-image,
Canny and Depth control) on tiny repos built on the fly, on one ComponentsManager under auto offload,
printing the manager's table after each workflow and the offload summary at the end.
``modular run REPO [options] [--then REPO_B [options]] ...`` runs any supported repos on one manager;
``modular batch JOB`` runs a job file's images, resumable and data-parallel (``modular/cli/batch_command.py``);
``modular serve REPO...`` serves repos over HTTP (``modular/cli/serve_command.py``; with ``--ray`` on Ray Serve,
``modular/cli/serve_ray.py``);
``modular inspect REPO`` shows a pipeline without loading weights; ``modular families`` lists the
installed block families and their workflows.

Every error is one line on stderr, ``modular: error: <type>: <message>`` (``modular run: error: ...`` for
a bad argument), and exit status 2 (130 when interrupted); ``--debug`` or ``MODULAR_DEBUG=1`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from modular.cli.arg_types import byte_size, positive_int

# Only the options here: the subcommands that run models import them (and torch) when they run, so that
# --help, `modular families` and a refused argument answer at once (tests/test_startup.py).
from modular.cli.args import (
    BATCH_DESCRIPTION,
    DEFAULT_FAMILY,
    RUN_DESCRIPTION,
    SERVE_DESCRIPTION,
    add_batch_arguments,
    add_job_arguments,
    add_serve_arguments,
)

__all__ = ["main", "positive_int"]

ERROR_STATUS = 2  # what argparse exits with for a bad argument: one status for every refused run
INTERRUPTED_STATUS = 130  # the shell's status for a command stopped by Ctrl-C (128 + SIGINT)
THEN = "--then"
DESCRIPTION = """\
modular run                            the built-in scenario: three FLUX.1 workflows, one manager, auto offload
modular run REPO [--then REPO_B ...]   any supported repos on one manager (see modular run --help)
modular batch JOB                      a job file's images: resumable, data-parallel under torchrun
modular serve REPO_OR_WORKFLOW...      a queue over one manager, served over HTTP with a page to watch it
modular inspect REPO                   a pipeline's blocks, docs and components, without loading weights
modular families                       the installed block families and their workflows"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``<prog>: error: <message>``, exit status 2."""

    hint = ""  # said after an unrecognized argument

    def error(self, message: str) -> NoReturn:
        hint = self.hint if message.startswith("unrecognized arguments") else ""
        self.exit(ERROR_STATUS, f"{self.prog}: error: {message}{hint}\n")


def run(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from modular.cli import run_command as cli_run

    cli_run.run_command(args, args.thens)
    return 0


def batch(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from modular.cli import batch_command as cli_batch

    return cli_batch.batch_command(args)


def serve(args: argparse.Namespace) -> int:
    from modular.cli import serve_command as cli_serve
    from modular.cli import serve_ray

    serve_ray.check_ray_options(args)  # Ray's options without --ray, one machine's with it: before any import
    if args.ray:
        missing = serve_ray.missing_ray()
        if missing is not None:
            print(missing, file=sys.stderr)
            return ERROR_STATUS
        serve_ray.check_ray_arguments(args)  # before torch, Ray and the models start
        _quiet_libraries()
        return serve_ray.serve_ray_command(args)
    cli_serve.check_serve_arguments(args)  # refusals first: before torch and the models are imported
    _quiet_libraries()
    return cli_serve.serve_command(args)


def inspect(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from modular.cli.inspect_command import inspect_command

    return inspect_command(args)


def families(args: argparse.Namespace) -> int:
    from modular.families import available_families

    found = available_families()
    if not found:
        print("No block family is installed (entry point group 'modular.blocks').")
        return 0
    for name, family in sorted(found.items()):  # what a family declares: none of its modules is imported
        extras = [
            label
            for label, present in (("tiny repo", family.ships_tiny_repo), ("scenario", family.ships_demo))
            if present
        ]
        print(
            f"{name}: {family.blocks_class_names[0]}"
            + (f" (ships a {' and a '.join(extras)})" if extras else "")
        )
        print(f"  workflows: {', '.join(family.workflows) or 'none named'}")
        print(f"  serves: {', '.join(family.classic_pipelines) or 'its own indexes only'}")
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (or set MODULAR_DEBUG=1)"
    )


def _add_repo(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("repo", nargs="?", metavar="REPO", help=f"a local folder or hub repo id ({what})")
    parser.add_argument("--repo", dest="repo_flag", metavar="REPO", help="the same as REPO (older spelling)")
    parser.add_argument(
        "--family", help=f"without a REPO: that family's tiny random repo (e.g. {DEFAULT_FAMILY})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="modular", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from modular import __version__

    parser.add_argument("--version", action="version", version=f"modular {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser(
        "run",
        help="generate images: the built-in scenario, or REPO [--then REPO ...]",
        description=RUN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_repo(run_parser, "default: the built-in scenario")
    add_job_arguments(run_parser)
    run_parser.add_argument(
        "--offload",
        default="auto",
        metavar="DEVICE",
        help="auto offload onto DEVICE: auto (CUDA, else a simulated device when there is a budget), cuda, "
        "cuda:1, sim (a simulated device of --budget), none",
    )
    run_parser.add_argument("--budget", type=byte_size, help="device bytes the weights may use, e.g. 8GB")
    run_parser.add_argument(
        "--margin", type=byte_size, help="bytes kept free on the device (default 3GB; 0 on a simulated one)"
    )
    run_parser.add_argument(
        "--output", "-o", help="folder for the images and the memory plot (default ./out)"
    )
    run_parser.add_argument("--out", help=argparse.SUPPRESS)  # the older spelling: one tiny-repo image
    run_parser.add_argument(
        "--quiet", action="store_true", help="no progress (the bar on a terminal, the step lines elsewhere)"
    )
    run_parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace output files of the same name (default: a new file is numbered, name-run2.png)",
    )
    run_parser.add_argument(
        "--table",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print the manager's table after each job (default); --no-table leaves it out",
    )
    _add_common(run_parser)
    batch_parser = commands.add_parser(
        "batch",
        help="a job file's images: resumable, data-parallel under torchrun (see docs/batch.md)",
        description=BATCH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_batch_arguments(batch_parser)
    _add_common(batch_parser)
    serve_parser = commands.add_parser(
        "serve",
        help="serve repos over HTTP: a queue over one manager, an API and a page (see docs/serving.md)",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_arguments(serve_parser)
    _add_common(serve_parser)
    inspect_parser = commands.add_parser(
        "inspect", help="show a pipeline's blocks and components (no weights)"
    )
    _add_repo(inspect_parser, f"default: the tiny repo of --family, {DEFAULT_FAMILY}")
    inspect_parser.add_argument("--workflow", help="prune to one named workflow, e.g. text2image")
    _add_common(inspect_parser)
    families_parser = commands.add_parser(
        "families", help="list the installed block families and their workflows"
    )
    _add_common(families_parser)
    return parser


def then_parser() -> argparse.ArgumentParser:
    """The options of a job after ``--then``: a REPO and the job options (run options come first)."""
    parser = _Parser(prog=f"modular run {THEN}", add_help=False)
    parser.hint = f" (options of the whole run, such as --budget or --output, go before the first {THEN})"
    parser.add_argument("repo", metavar="REPO")
    add_job_arguments(parser)
    return parser


def _split_then(argv: list[str]) -> tuple[list[str], list[list[str]]]:
    """The arguments before the first ``--then`` and each job's after it (for ``modular run`` only)."""
    if not argv or argv[0] != "run" or THEN not in argv:
        return argv, []
    parts: list[list[str]] = [[]]
    for arg in argv:
        if arg == THEN:
            parts.append([])
        else:
            parts[-1].append(arg)
    return parts[0], parts[1:]


def _quiet_libraries() -> None:
    """Keep the libraries' own progress bars and notices out of the command's output (ours replace them)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    # transformers says, once per class, that a torchvision-backed image processor falls back to PIL when
    # torchvision is absent (diffusers' classic pipelines import them); the fallback is what we use.
    logging.getLogger("transformers.utils.import_utils").setLevel(logging.ERROR)


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
    head, segments = _split_then(list(sys.argv[1:] if argv is None else argv))
    if not head and not segments:  # bare `modular`: what it can do, not a one-line error
        print(build_parser().format_help(), end="")
        return 0
    args = build_parser().parse_args(head)
    args.thens = [then_parser().parse_args(segment) for segment in segments]
    debug = args.debug or os.environ.get("MODULAR_DEBUG", "") not in ("", "0")
    try:
        commands = {"run": run, "batch": batch, "serve": serve, "inspect": inspect, "families": families}
        return commands[args.command](args)
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
