"""save_pretrained: adds or replaces only its own files, refuses to replace weights in use, survives a kill."""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import modular.pipeline.saving
from blocks.stable_diffusion import make_tiny_repo
from components.load_id import decode_load_id, get_load_id
from modular import ComponentsManager, ModularPipeline
from modular.errors import SaveTargetInUseError
from modular.pipeline.index import CLASSIC_INDEX, MODULAR_INDEX

from .saved import same_weights
from .tiny_sd import tiny_sd_latents

MODELS = ("unet", "vae", "text_encoder")
SAVED = ("scheduler", "text_encoder", "tokenizer", "unet", "vae")


@pytest.fixture(scope="module")
def other_repo(tmp_path_factory):
    return make_tiny_repo(tmp_path_factory.mktemp("other") / "tiny-sd-7", seed=7)


def _loaded(repo, names=None, **kwargs):
    pipe = ModularPipeline.from_pretrained(repo, **kwargs)
    pipe.load_components(names, torch_dtype=torch.float32)
    return pipe


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _leftovers(folder: Path) -> list[str]:
    """Staging folders and backups of a save, in ``folder`` and beside it (where those exist)."""
    names = [p.name for place in (folder, folder.parent) if place.exists() for p in place.iterdir()]
    return sorted(n for n in names if "saving-" in n or ".old-" in n)


def test_saving_keeps_the_users_other_files(repo, tmp_path):
    """Saving into a folder adds the components and the index; the user's other files stay as they were."""
    target = tmp_path / "mine"
    (target / "notes").mkdir(parents=True)
    (target / "notes" / "todo.txt").write_text("keep me")
    (target / "README.md").write_text("# my pipeline")
    (target / ".hidden").write_text("me too")
    before = _files(target)
    _loaded(repo).save_pretrained(target)
    after = _files(target)
    assert {k: after[k] for k in before} == before
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [".hidden", "README.md", "notes", MODULAR_INDEX, *SAVED]
    )


def test_saving_replaces_only_the_component_folders_it_writes(repo, other_repo, tmp_path):
    """A second save replaces each written component folder whole (stale files go) and keeps unwritten ones."""
    target = tmp_path / "saved"
    _loaded(repo).save_pretrained(target)
    (target / "unet" / "stale.txt").write_text("from the first save")
    _loaded(other_repo, ["unet"]).save_pretrained(target)
    assert not (target / "unet" / "stale.txt").exists()
    assert sorted(p.name for p in target.iterdir()) == sorted([MODULAR_INDEX, *SAVED])
    index = json.loads((target / MODULAR_INDEX).read_text())
    assert index["vae"][2]["pretrained_model_name_or_path"] == str(other_repo)


def test_an_empty_path_is_refused(repo, tmp_path, monkeypatch):
    """save_pretrained("") raises a ValueError that says what to pass, and writes nothing."""
    monkeypatch.chdir(tmp_path)
    pipe = _loaded(repo, ["unet"])
    with pytest.raises(ValueError) as caught:
        pipe.save_pretrained("")
    assert str(caught.value) == (
        'save_pretrained: the folder is empty (got ""); pass a folder, e.g. "saved", or "." for this one'
    )
    assert list(tmp_path.iterdir()) == []


def test_saving_to_dot_keeps_the_other_files_of_the_current_folder(repo, tmp_path, monkeypatch):
    """save_pretrained(".") adds the components to the current folder and keeps everything else in it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')")
    (tmp_path / "beside.txt").write_text("a sibling")
    monkeypatch.chdir(work)
    pipe = _loaded(repo)
    pipe.save_pretrained(".")
    assert (work / "train.py").read_text() == "print('hi')"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beside.txt", "work"]
    assert sorted(p.name for p in work.iterdir()) == sorted(["train.py", MODULAR_INDEX, *SAVED])
    again = _loaded(".")
    assert torch.equal(tiny_sd_latents(again), tiny_sd_latents(pipe))


def test_saving_into_the_source_repo_keeps_it_loading(repo, tmp_path):
    """Saving into the repo a pipeline was partly loaded from keeps every component; it still loads whole."""
    source = Path(shutil.copytree(repo, tmp_path / "source"))
    full = _loaded(repo)
    pipe = _loaded(source, ["unet", "text_encoder"])
    pipe.save_pretrained(source)
    assert sorted(p.name for p in source.iterdir()) == sorted([CLASSIC_INDEX, MODULAR_INDEX, *SAVED])
    entries = json.loads((source / MODULAR_INDEX).read_text())
    assert {n: entries[n][2]["pretrained_model_name_or_path"] for n in SAVED} == dict.fromkeys(SAVED)
    again = _loaded(source)
    assert again.null_component_names == []
    assert all(same_weights(getattr(again, n), getattr(full, n)) for n in MODELS)
    assert torch.equal(tiny_sd_latents(again), tiny_sd_latents(full))


def test_saving_over_files_a_loaded_component_reads_is_refused(repo, tmp_path):
    """A save that would replace the folder a loaded component came from raises and changes nothing."""
    source = Path(shutil.copytree(repo, tmp_path / "source"))
    pipe = _loaded(source)
    before = _files(source)
    with pytest.raises(SaveTargetInUseError) as caught:
        pipe.save_pretrained(source / "unet")
    assert str(caught.value) == (
        f"save_pretrained: cannot save into {source / 'unet'}: component 'unet' is loaded from "
        f"{source / 'unet'}, and this save would replace {source / 'unet' / 'text_encoder'}, which it may still "
        "read (weights load lazily or memory-mapped). Save to another folder, or call "
        "pipe.unload_components('unet') first."
    )
    assert isinstance(caught.value, ValueError)
    assert _files(source) == before
    assert _leftovers(source) == []


def test_saving_over_files_another_pipeline_reads_through_the_manager_is_refused(repo, other_repo, tmp_path):
    """Weights that a pipeline sharing the manager loaded from the target are not replaced under it."""
    source = Path(shutil.copytree(repo, tmp_path / "source"))
    cm = ComponentsManager()
    _loaded(source, components_manager=cm)
    writer = _loaded(other_repo, components_manager=cm)
    before = _files(source)
    first, fields = next(
        (cid, decode_load_id(get_load_id(obj)))
        for cid, obj in cm.components.items()
        if (get_load_id(obj) or "").startswith(str(source))
    )
    where = source / fields["subfolder"]
    with pytest.raises(SaveTargetInUseError) as caught:
        writer.save_pretrained(source)
    assert str(caught.value) == (
        f"save_pretrained: cannot save into {source}: manager component {first!r} is loaded from {where}, and "
        f"this save would replace {where}, which it may still read (weights load lazily or memory-mapped). "
        f"Save to another folder, or call components_manager.remove({first!r}) first."
    )
    assert _files(source) == before
    assert _leftovers(source) == []


def test_a_moved_folder_loads_its_own_weights(repo, tmp_path):
    """A saved folder moved elsewhere (the original gone) loads from where it is now, with equal outputs."""
    pipe = _loaded(repo)
    pipe.save_pretrained(tmp_path / "first")
    moved = Path(shutil.move(tmp_path / "first", tmp_path / "elsewhere" / "moved"))
    again = _loaded(moved)
    assert again.get_component_spec("unet").load_id == f"{moved}|unet|null|null"
    assert all(same_weights(getattr(again, n), getattr(pipe, n)) for n in MODELS)
    assert torch.equal(tiny_sd_latents(again), tiny_sd_latents(pipe))


def test_a_copied_folder_loads_its_own_weights_not_the_originals(repo, other_repo, tmp_path):
    """A copy of a saved folder keeps loading its own weights after the original is saved over."""
    pipe = _loaded(repo)
    pipe.save_pretrained(tmp_path / "original")
    copy = Path(shutil.copytree(tmp_path / "original", tmp_path / "copy"))
    _loaded(other_repo).save_pretrained(tmp_path / "original")
    again = _loaded(copy)
    assert all(same_weights(getattr(again, n), getattr(pipe, n)) for n in MODELS)


def test_a_failed_save_leaves_no_folder(repo, tmp_path, monkeypatch):
    """A save that fails midway leaves neither the target folder nor a staging folder."""
    pipe = _loaded(repo)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pipe.vae, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        pipe.save_pretrained(tmp_path / "saved")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_save_over_an_existing_folder_keeps_the_old_one(repo, tmp_path, monkeypatch):
    """A save over a folder that fails midway leaves the old contents in place, byte for byte."""
    pipe = _loaded(repo)
    target = tmp_path / "saved"
    pipe.save_pretrained(target)
    before, listing = _files(target), sorted(p.relative_to(target) for p in target.rglob("*"))
    monkeypatch.setattr(pipe.unet, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        pipe.save_pretrained(target)
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == listing
    assert _files(target) == before
    assert [p.name for p in tmp_path.iterdir()] == ["saved"]


def _stop_after(monkeypatch, function: str, call: int) -> None:
    """Stop a save right after its ``call``-th ``os.<function>``, as a kill would: no cleanup runs.

    A save into an existing folder calls os.replace for the staged index, the plan, then the commit, and
    os.rename twice per component (old one aside, new one in); a new folder's save renames once, at the end.
    """
    monkeypatch.setattr(modular.pipeline.saving, "_finish", lambda target, staging: None)
    monkeypatch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)
    original, calls = getattr(os, function), []

    def stopping(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(args)
        if len(calls) == call:
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(os, function, stopping)


@pytest.mark.parametrize(
    ("function", "call", "side"),
    [
        ("replace", 2, "old"),
        ("rename", 1, "old"),
        ("rename", 2, "old"),
        ("rename", 7, "old"),
        ("replace", 3, "new"),
    ],
    ids=["staged", "one-aside", "one-swapped", "most-swapped", "committed"],
)
def test_leftovers_of_an_interrupted_save_are_recovered_by_a_load(
    repo, other_repo, tmp_path, monkeypatch, function, call, side
):
    """Loading a folder whose save stopped midway undoes it (before the commit) or completes it (after)."""
    old, new = _loaded(repo), _loaded(other_repo)
    target = tmp_path / "saved"
    old.save_pretrained(target)
    with monkeypatch.context() as patch:
        _stop_after(patch, function, call)
        with pytest.raises(KeyboardInterrupt):
            new.save_pretrained(target)
    assert _leftovers(target) != []
    again = _loaded(target)
    assert _leftovers(target) == []
    assert sorted(p.name for p in target.iterdir()) == sorted([MODULAR_INDEX, *SAVED])
    expected = old if side == "old" else new
    assert all(same_weights(getattr(again, n), getattr(expected, n)) for n in MODELS)


def test_leftovers_of_an_interrupted_save_are_cleaned_by_the_next_save(
    repo, other_repo, tmp_path, monkeypatch
):
    """The next save removes a stopped new folder's staging folder, and undoes a stopped save's swaps."""
    old, new = _loaded(repo), _loaded(other_repo)
    target = tmp_path / "saved"
    with monkeypatch.context() as patch:
        _stop_after(patch, "replace", 1)  # a new folder's staged index is written, not yet renamed into place
        with pytest.raises(KeyboardInterrupt):
            old.save_pretrained(target)
    assert not target.exists() and len(_leftovers(target)) == 1
    old.save_pretrained(target)
    assert _leftovers(target) == []
    with monkeypatch.context() as patch:
        _stop_after(patch, "rename", 3)
        with pytest.raises(KeyboardInterrupt):
            new.save_pretrained(target)
    assert _leftovers(target) != []
    new.save_pretrained(target)
    assert _leftovers(target) == []
    assert sorted(p.name for p in target.iterdir()) == sorted([MODULAR_INDEX, *SAVED])
    assert all(same_weights(getattr(_loaded(target), n), getattr(new, n)) for n in MODELS)


def test_a_running_save_is_left_alone_by_a_load_and_a_second_save_is_refused(repo, tmp_path, monkeypatch):
    """While a save runs, loading the folder leaves its staging alone and another save into it raises."""
    pipe = _loaded(repo)
    target = tmp_path / "saved"
    pipe.save_pretrained(target)
    started, release = threading.Event(), threading.Event()
    save_unet = pipe.unet.save_pretrained

    def slow(*args, **kwargs):
        started.set()
        release.wait(30)
        return save_unet(*args, **kwargs)

    monkeypatch.setattr(pipe.unet, "save_pretrained", slow)
    errors = []

    def save():
        try:
            pipe.save_pretrained(target)
        except BaseException as error:
            errors.append(error)

    saving = threading.Thread(target=save)
    saving.start()
    try:
        assert started.wait(30)
        staging = [p.name for p in target.iterdir() if "saving-" in p.name]
        ModularPipeline.from_pretrained(target)
        assert [p.name for p in target.iterdir() if "saving-" in p.name] == staging != []
        with pytest.raises(BlockingIOError, match="another save into it is running"):
            _loaded(repo, ["vae"]).save_pretrained(target)
    finally:
        release.set()
        saving.join()
    assert errors == []
    assert _leftovers(target) == []


# ----- killed saves -----

# The child loads the new pipeline once, then forks one process per kill: each saves with a tracer that
# SIGKILLs it at its n-th executed line of modular/pipeline/saving.py's disk steps (recovery included).
_KILLER = r"""
import json, os, signal, sys
import torch
torch.set_num_threads(1)  # no thread pool before the forks
from modular import ModularPipeline
import modular.pipeline.saving

new_repo, cases = sys.argv[1], json.loads(sys.argv[2])
pipe = ModularPipeline.from_pretrained(new_repo)
pipe.load_components(["unet", "vae", "text_encoder", "scheduler"], torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
# The functions that touch the disk (planning and building the index only read).
STEPS = {"save_pipeline", "recover_interrupted_save", "_locked", "_finish", "_remove", "_save_new", "_save_into",
         "_staging_folder", "_save_component", "_write_json"}


def traced_save(target, kill_at):
    lines = 0

    def local(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
            if lines == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return local

    def start(frame, event, arg):
        code = frame.f_code
        return local if code.co_filename == modular.pipeline.saving.__file__ and code.co_name in STEPS else None

    sys.settrace(start)
    try:
        pipe.save_pretrained(target)
    finally:
        sys.settrace(None)
    return lines


if cases == "count":
    print(json.dumps([traced_save(sys.argv[3], 0), traced_save(sys.argv[4], 0)]))
    sys.exit()
results = []
for target, kill_lines in cases:
    for line in kill_lines:
        pid = os.fork()
        if pid == 0:
            traced_save(target, line)
            os._exit(0)
        results.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(results))
"""


def _run_killer(*args: str) -> list:
    done = subprocess.run(
        [sys.executable, "-c", _KILLER, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_save(repo, other_repo, tmp_path):
    """Killed at 23 points (recovery, staging, swaps, commit, cleanup), each folder loads as the old or new save."""
    old = _loaded(repo)
    new = _loaded(other_repo, ["unet", "vae", "text_encoder", "scheduler"])
    base = tmp_path / "base" / "saved"
    old.save_pretrained(base)
    references = tmp_path / "references"
    new.save_pretrained(Path(shutil.copytree(base, references / "over")))
    new_index = json.loads((references / "over" / MODULAR_INDEX).read_text())
    old_index = json.loads((base / MODULAR_INDEX).read_text())
    assert new_index != old_index  # the new save leaves the tokenizer where the old one was

    over_lines, fresh_lines = _run_killer(
        str(other_repo),
        '"count"',
        str(shutil.copytree(base, tmp_path / "count" / "over")),
        str(tmp_path / "count-fresh" / "saved"),
    )
    cases = []  # (folder, kill lines in order, a save existed before)
    for i in range(13):  # one kill, spread over the whole save into an existing folder
        cases.append((tmp_path / f"over{i}" / "saved", [1 + i * (over_lines - 1) // 12], True))
    for i in range(4):  # a new folder
        cases.append((tmp_path / f"fresh{i}" / "saved", [1 + i * (fresh_lines - 1) // 3], False))
    for i, second in enumerate((4, 12, 24)):  # a kill in the swaps, then one in the next save's recovery
        cases.append((tmp_path / f"twice{i}" / "saved", [over_lines * (6 + i) // 10, second], True))
    for folder, _, existed in cases:
        if existed:
            shutil.copytree(base, folder)
    codes = _run_killer(str(other_repo), json.dumps([(str(f), lines) for f, lines, _ in cases]))
    assert codes == [-9] * 23, codes  # every process was killed

    sides, swapping = set(), 0
    for folder, lines, existed in cases:
        swapping += any(".old-" in name for name in _leftovers(folder))
        if existed or folder.exists():
            again = _loaded(folder)
            index = json.loads((folder / MODULAR_INDEX).read_text())
            assert index in (old_index, new_index), (folder, lines)
            expected = old if index == old_index else new
            sides.add(id(expected))
            same = [same_weights(getattr(again, n), getattr(expected, n)) for n in MODELS]
            assert same == [True] * len(MODELS), (folder, lines)
            assert _leftovers(folder) == [], (folder, lines)
        new.save_pretrained(folder)
        assert _leftovers(folder) == [], (folder, lines)
        kept = SAVED if existed else tuple(n for n in SAVED if n != "tokenizer")
        assert sorted(p.name for p in folder.iterdir()) == sorted([MODULAR_INDEX, *kept]), (folder, lines)
    assert sides == {id(old), id(new)} and swapping >= 3  # kills fell before, during and after the swaps
