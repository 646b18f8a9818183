"""``save_pretrained``: components and a ``modular_model_index.json``, added to a folder without losing anything.

A save writes ``<folder>/<name>`` for each loaded component and ``<folder>/modular_model_index.json``; nothing
else in the folder is touched. Saved entries hold ``pretrained_model_name_or_path: null`` and
``subfolder: <name>``, which readers (ours and the peer) resolve to the folder the index is read from, so a
saved folder that is moved or copied loads its own weights.

The protocol. After the process is killed at any point, each component folder and the index hold either the
old complete save or the new complete one, and the folder as a whole is one of the two:

1. A folder that does not exist yet is written whole into a hidden sibling ``.<folder>.modular-saving-<token>`` and
   renamed into place.
2. Into an existing folder, everything is first written into ``<folder>/.modular-saving-<token>``: the components, the
   new index, and last ``plan.json`` (the names to replace), which marks the staging complete.
3. Each planned ``<name>`` is renamed to ``.<name>.old-<token>`` and the staged one renamed to ``<name>``.
4. The commit: the staged index replaces ``<folder>/modular_model_index.json`` (``os.replace``).
5. The backups are deleted, then the staging folder.

:func:`recover_interrupted_save` finishes whatever a killed save left: a staging folder without a plan is
deleted; with a plan and the staged index still in it (not committed) every swap is undone; with a plan and no
staged index (committed) the backups are deleted. Each of its steps leaves a state it handles itself, so a kill
during recovery is recovered by the next one. It runs at the start of every save and whenever a local folder's
index is read. A save holds an ``flock`` on its staging folder, so recovery leaves a live save alone and a
second concurrent save into the same folder is refused (POSIX only).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import secrets
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import diffusers

from components.library_bars import library_bars_hidden
from components.load_id import NULL_LOAD_ID, decode_load_id, get_load_id
from components.weight_marks import is_modified
from modular.adapters.lora_saving import saving_plain_weights
from modular.errors import SaveTargetInUseError
from modular.families import available_families, family_of_blocks
from modular.pipeline.config_components import changed_config_components
from modular.pipeline.index import MODULAR_INDEX, spec_to_entry
from modular.pipeline.save_options import SaveOptions

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from modular.pipeline.pipeline import ModularPipeline

__all__ = ["check_save_target", "index_dict", "recover_interrupted_save", "save_pipeline"]

_STAGING = ".modular-saving-"
_BACKUP = ".old-"
_PLAN = "plan.json"


def index_dict(
    pipe: ModularPipeline, target: Path | None = None, saved: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    """The index in the peer's shape.

    Components in ``saved`` (written to ``target/<name>``, by name with the variant written), and any other
    whose files lie in a subfolder of ``target``, get ``pretrained_model_name_or_path=None`` and their
    subfolder: "this folder".
    """
    saved = saved or {}
    blocks_class_name, workflow = _blocks_origin(pipe)
    data: dict[str, Any] = {
        "_blocks_class_name": blocks_class_name,
        "_class_name": _peer_pipeline_class_name(blocks_class_name),
        "_diffusers_version": diffusers.__version__,
    }
    if workflow:
        data["_workflow"] = workflow
    data.update(pipe._config)
    for name, spec in pipe._specs.items():
        # From-config components are listed only when saved here (modular/pipeline/config_components.py).
        if spec.default_creation_method != "from_pretrained" and name not in saved:
            continue
        entry = spec_to_entry(spec, pipe._components[name])
        fields = entry[2]
        if name in saved:
            fields.update(
                pretrained_model_name_or_path=None, subfolder=name, variant=saved[name], revision=None
            )
        elif target is not None and fields["subfolder"] and _root(fields) == target:
            fields.update(pretrained_model_name_or_path=None, revision=None)
        data[name] = entry
    return data


def _peer_pipeline_class_name(blocks_class_name: str) -> str:
    """The pipeline class diffusers' modular system should build for these blocks (the family says)."""
    family = family_of_blocks(blocks_class_name)
    return family.peer_pipeline_class_for(blocks_class_name) if family is not None else "ModularPipeline"


def _blocks_origin(pipe: ModularPipeline) -> tuple[str, str | None]:
    """The blocks class and workflow a reader rebuilds this pipeline's blocks from.

    Blocks pruned with ``family_blocks.get_workflow(name)`` and bound with ``init_pipeline`` are a plain
    ``SequentialPipelineBlocks`` that no family knows by class name: they are saved as the family's blocks
    class plus the workflow whose steps they are, so ``from_pretrained`` rebuilds the same steps
    (test_a_workflow_pipeline_round_trips in tests/modular/test_peer_behaviours.py).
    """
    if pipe._workflow or family_of_blocks(pipe._blocks_class_name) is not None:
        return pipe._blocks_class_name, pipe._workflow
    steps = _leaves(pipe.blocks)
    if not steps:
        return pipe._blocks_class_name, None
    for family in available_families().values():
        for blocks_class in family.all_blocks_classes:
            full = blocks_class()
            for workflow in full._workflow_map or {}:
                pruned = full.get_workflow(workflow)
                if pruned is not None and _leaves(pruned) == steps:
                    return blocks_class.__name__, workflow
    return pipe._blocks_class_name, None


def _leaves(blocks: Any) -> list[tuple[str, type]]:
    """The blocks' children by name and class: what a workflow's pruned blocks are made of."""
    return [(name, type(child)) for name, child in blocks.sub_blocks.items()]


def _root(fields: dict[str, Any]) -> Path | None:
    """The resolved local folder of a load ID's repo; ``None`` for a hub repo or none."""
    repo = fields["pretrained_model_name_or_path"]
    if not repo or not os.path.isdir(os.path.expanduser(repo)):
        return None
    return Path(os.path.expanduser(repo)).resolve()


def _location(fields: dict[str, Any]) -> Path | None:
    root = _root(fields)
    return None if root is None else (root / (fields["subfolder"] or "")).resolve()


def _load_fields(obj: Any, fallback: str) -> dict[str, Any]:
    return decode_load_id(get_load_id(obj) or fallback)


def _loaded_from(pipe: ModularPipeline) -> list[tuple[str, str, Path]]:
    """``(who, how to unload it, local folder)`` of every loaded object: the pipeline's and its manager's."""
    found = []
    for name, obj in pipe._components.items():
        location = None if obj is None else _location(_load_fields(obj, pipe._specs[name].load_id))
        if location is not None:
            found.append((f"component {name!r}", f"pipe.unload_components({name!r})", location))
    cm = pipe._components_manager
    for component_id, obj in (cm.components if cm is not None else {}).items():
        location = _location(_load_fields(obj, NULL_LOAD_ID))
        if location is not None:
            found.append(
                (
                    f"manager component {component_id!r}",
                    f"components_manager.remove({component_id!r})",
                    location,
                )
            )
    return found


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def _plan(pipe: ModularPipeline, target: Path, overwrite_index: bool = True) -> list[str]:
    """The components to write; refuses to replace files a loaded component is read from.

    A component loaded from exactly ``target/<name>`` is not written again: its files are already there
    (and may be memory-mapped). Test: test_saving_into_the_source_repo_keeps_it_loading. Without
    ``overwrite_index`` a component with a load ID keeps its entry, so its weights are not written: nothing
    would read them (test_an_index_that_keeps_its_sources_is_written_without_weights).
    """
    write = []
    changed = changed_config_components(pipe)  # from-config components that differ from the blocks' own
    for name, spec in pipe._specs.items():
        obj = pipe._components[name]
        if obj is None or (spec.default_creation_method != "from_pretrained" and name not in changed):
            continue
        if is_modified(obj):  # its weights are no longer its load ID's: only writing them keeps them
            write.append(name)
            continue
        if not overwrite_index and get_load_id(obj) not in (None, NULL_LOAD_ID):
            continue
        if _location(_load_fields(obj, spec.load_id)) != target / name:
            write.append(name)
    replaced = [target / name for name in write] + [target / MODULAR_INDEX]
    for who, fix, where in _loaded_from(pipe):
        hit = next((path for path in replaced if _overlaps(where, path)), None)
        if hit is not None:
            msg = (
                f"save_pretrained: cannot save into {target}: {who} is loaded from {where}, and this save would "
                f"replace {hit}, which it may still read (weights load lazily or memory-mapped). Save to another "
                f"folder, or call {fix} first."
            )
            raise SaveTargetInUseError(msg)
    return write


def _save_options(obj: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``options`` (``safe_serialization``, ``variant``, ``max_shard_size``) that ``obj``'s save takes."""
    save = getattr(obj, "save_pretrained", None)
    if save is None:
        msg = f"cannot save {type(obj).__name__}: it has no save_pretrained method"
        raise TypeError(msg)
    accepted = inspect.signature(save).parameters
    return {key: value for key, value in options.items() if key in accepted and value is not None}


def _save_component(pipe: ModularPipeline, obj: Any, folder: Path, kwargs: Mapping[str, Any]) -> None:
    """Write ``obj`` with its weights in memory (one whose host copy was dropped under a host budget is read
    back: ``ComponentsManager.host_weights``), and a model holding LoRA layers as its plain (or fused) weights,
    not peft's wrapped names."""
    cm = pipe._components_manager
    with (
        cm.host_weights(obj) if cm is not None else contextlib.nullcontext(),
        saving_plain_weights(obj),
        library_bars_hidden(),  # transformers' "Writing model shards", unless asked for
    ):
        obj.save_pretrained(str(folder), **kwargs)


def _write_json(path: Path, data: Any) -> None:
    """Write ``path`` whole or not at all (a temporary file, flushed to disk, then renamed)."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w") as file:
        file.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[bool]:
    """Hold an exclusive lock on ``folder`` while inside; yields False when another holder has it."""
    if sys.platform == "win32":
        yield True
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _staging_folder(parent: Path, prefix: str) -> Path:
    # Not tempfile.mkdtemp: its folders are private (0o700), and a new save is this folder renamed.
    staging = parent / f"{prefix}{secrets.token_hex(6)}"
    staging.mkdir()
    return staging


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def check_save_target(save_directory: str | os.PathLike) -> Path:
    """The resolved folder to save into; refuses an empty path and a file."""
    if os.fspath(save_directory) == "":
        msg = (
            'save_pretrained: the folder is empty (got ""); pass a folder, e.g. "saved", or "." for this one'
        )
        raise ValueError(msg)
    target = Path(save_directory).resolve()
    if target.exists() and not target.is_dir():
        msg = f"cannot save to {target}: it exists and is not a folder"
        raise FileExistsError(msg)
    return target


def save_pipeline(
    pipe: ModularPipeline, save_directory: str | os.PathLike, options: SaveOptions | None = None
) -> dict[str, Any]:
    """Write every loaded component into ``save_directory/<name>`` and the index; see the module docstring.

    ``options`` (``modular/pipeline/save_options.py``) say how weights are written and whether saved components'
    entries point at this folder. Returns the index written.

    Raises:
        ValueError: ``save_directory`` is empty.
        SaveTargetInUseError: a loaded component is read from files this save would replace.
        FileExistsError: ``save_directory`` is a file.
        BlockingIOError: another save into the folder is running.
        TypeError: a component to write has no ``save_pretrained``.
    """
    options = options or SaveOptions()
    target = check_save_target(save_directory)
    if not recover_interrupted_save(target):
        msg = f"cannot save to {target}: another save into it is running; wait for it to finish"
        raise BlockingIOError(msg)
    write = _plan(pipe, target, options.overwrite_modular_index)
    kwargs = {name: _save_options(pipe._components[name], options.weight_options()) for name in write}
    index = index_dict(pipe, target, saved={name: kwargs[name].get("variant") for name in write})
    if target.exists():
        _save_into(pipe, target, kwargs, index)
    else:
        _save_new(pipe, target, kwargs, index)
    return index


def _save_new(pipe: ModularPipeline, target: Path, write: dict[str, dict], index: dict[str, Any]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _staging_folder(target.parent, f".{target.name}{_STAGING}")
    with _locked(staging):
        try:
            for name, kwargs in write.items():
                _save_component(pipe, pipe._components[name], staging / name, kwargs)
            _write_json(staging / MODULAR_INDEX, index)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _save_into(pipe: ModularPipeline, target: Path, write: dict[str, dict], index: dict[str, Any]) -> None:
    staging = _staging_folder(target, _STAGING)
    token = staging.name.removeprefix(_STAGING)
    with _locked(staging):
        try:
            for name, kwargs in write.items():
                _save_component(pipe, pipe._components[name], staging / name, kwargs)
            _write_json(staging / MODULAR_INDEX, index)
            _write_json(staging / _PLAN, list(write))
            for name in write:
                if os.path.lexists(target / name):
                    os.rename(target / name, target / f".{name}{_BACKUP}{token}")
                os.rename(staging / name, target / name)
            os.replace(staging / MODULAR_INDEX, target / MODULAR_INDEX)
        finally:
            _finish(target, staging)


def _finish(target: Path, staging: Path) -> None:
    """Complete (committed) or undo (not committed) the save that ``staging`` belongs to; delete ``staging``."""
    token = staging.name.removeprefix(_STAGING)
    plan_file = staging / _PLAN
    names = json.loads(plan_file.read_text()) if plan_file.is_file() else []
    committed = not (staging / MODULAR_INDEX).exists()
    for name in names:
        backup = target / f".{name}{_BACKUP}{token}"
        if committed:
            _remove(backup)
            continue
        # Swapped in iff no longer staged; moving it back makes the state "not swapped" again.
        if not os.path.lexists(staging / name) and os.path.lexists(target / name):
            os.rename(target / name, staging / name)
        if os.path.lexists(backup):
            os.rename(backup, target / name)
    shutil.rmtree(staging, ignore_errors=True)


def recover_interrupted_save(folder: str | os.PathLike) -> bool:
    """Finish or undo what a killed save left in ``folder``: see the module docstring.

    Returns False when another save into ``folder`` is running (its files are left alone), else True.
    """
    folder = Path(folder)
    idle = True
    entries = os.listdir(folder) if folder.is_dir() else []
    for staging in (folder / entry for entry in entries if entry.startswith(_STAGING)):
        with _locked(staging) as mine:
            if mine:
                _finish(folder, staging)
            idle = idle and mine
    if folder.parent != folder and folder.parent.is_dir():
        prefix = f".{folder.name}{_STAGING}"
        for entry in os.listdir(folder.parent):
            if entry.startswith(prefix):
                with _locked(folder.parent / entry) as mine:
                    if mine:
                        shutil.rmtree(folder.parent / entry, ignore_errors=True)
                    idle = idle and mine
    return idle
