"""``modular inspect REPO``: a pipeline's blocks, docs and components, without loading weights, in the terminal's
width, its load IDs naming the repo as the user gave it."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import textwrap
from collections.abc import Iterable
from pathlib import Path

from components.load_id import canonical_repo, decode_load_id, format_load_id
from components.table_layout import shorten_load_id
from modular.cli.args import DEFAULT_FAMILY

__all__ = ["fit_lines", "inspect_command", "shown_load_id"]

_CONTINUED = "    "  # a wrapped line goes on under its own indent, this much further in


def fit_lines(lines: Iterable[str], width: int, *, split_words: bool = True) -> list[str]:
    """``lines`` with each one longer than ``width`` wrapped at spaces, its continuation lines indented under
    it (its own indent plus four spaces); a word longer than a line is broken unless ``split_words=False``
    (a path stays whole, to be copied)."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(
            line,
            width,
            subsequent_indent=indent + _CONTINUED,
            break_on_hyphens=False,
            break_long_words=split_words,
            drop_whitespace=True,
        )
    return out


def shown_load_id(load_id: str | None, repo: str, shown_as: str) -> str:
    """``load_id`` with its repo named ``shown_as`` when it is ``repo`` (load IDs name a local folder by its
    resolved path: ``components.load_id.canonical_repo``); ``"null"`` for a component made from a config."""
    if not load_id:
        return "null"
    fields = decode_load_id(load_id)
    part = fields["pretrained_model_name_or_path"]
    if part is None or part not in {repo, canonical_repo(repo)}:
        return load_id
    return format_load_id(shown_as, fields["subfolder"], fields["variant"], fields["revision"])


def inspect_command(args: argparse.Namespace) -> int:
    """Print the block tree, the doc and each component's spec of ``args.repo`` (or of ``--family``'s tiny repo,
    built in a temporary folder and named ``tiny-<family>`` in the load IDs), fitted to the terminal's width."""
    from modular.cli.run_command import family_named, tiny_repo
    from modular.pipeline.pipeline import ModularPipeline

    width = shutil.get_terminal_size().columns
    with tempfile.TemporaryDirectory() as scratch:
        repo = args.repo or args.repo_flag
        shown_as = repo
        if repo is None:
            family = args.family or DEFAULT_FAMILY
            shown_as = f"tiny-{family}"  # the folder is gone when the command ends: name what it was
            repo = str(tiny_repo(family_named(family), Path(scratch) / shown_as))
        pipe = ModularPipeline.from_pretrained(repo, workflow=args.workflow)
        lines = [*repr(pipe.blocks).splitlines(), "", *pipe.doc.splitlines(), "Components (not loaded):"]
        for name in pipe.component_names:
            spec = pipe.get_component_spec(name)
            kind = spec.type_hint.__name__ if spec.type_hint else "?"
            prefix = f"  {name}: {kind}  load_id="
            load_id = shown_load_id(spec.load_id, repo, shown_as)
            lines.append(prefix + shorten_load_id(load_id, width - len(prefix)))
    print("\n".join(fit_lines(lines, width)))
    return 0
