"""Readers of a model's weights under a host budget: they read a dropped model back (never its placeholders),
removal reads nothing, a replaced source file is refused, and spill files never outlive their process."""

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from components import ComponentNotFoundError, ComponentsManager
from offload import DiskCopyError, OffloadEngine, SimulatedDevice
from offload.engine.hook import remove_hook
from offload.host import spill_files
from offload.host.spill_files import sweep_stale

from .test_host_tier import SIZE, X, build, enable, equal, loaded, reasons, run, without_offload

ROOT = Path(__file__).resolve().parents[2]


def weights(model):
    return {key: value.clone() for key, value in model.state_dict().items()}


def same(state, expected):
    return state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)


def on_disk(cm, ids):
    """The index of a model whose host copy is dropped now."""
    engine = cm.offload_engine
    return next(i for i, model_id in enumerate(ids) if engine.residency(model_id).on_disk)


# ----- reading weights -----


def test_state_dict_of_a_model_on_disk_holds_its_values(five, tmp_path):
    """A model's own state_dict() reads it back first: its values, no NaN; dropped again at a later placement."""
    cm, models, ids = five
    originals = [weights(model) for model in models]
    enable(cm, tmp_path)
    run(cm, models, times=1)
    victim = on_disk(cm, ids)
    state = models[victim].state_dict()
    assert same(state, originals[victim])
    run(cm, models, times=1)  # the budget holds again from the next placement on (checked after each call)
    assert cm.offload_engine.residency(ids[victim]).on_disk
    assert same(state, originals[victim])  # the tensors returned keep their values after a drop


def test_host_weights_keeps_a_model_in_memory_until_the_block_ends(five, tmp_path):
    """Inside cm.host_weights(id) the model is read back and never dropped, however the others run; after,
    the budget holds again. Outputs stay equal."""
    cm, models, ids = five
    originals = [weights(model) for model in models]
    expected = without_offload(models, times=3)
    enable(cm, tmp_path)
    outputs = run(cm, models, times=1)
    victim = on_disk(cm, ids)
    engine = cm.offload_engine
    with cm.host_weights(ids[victim]), cm.host_weights(models[victim]):  # by id or object; holds nest
        assert not engine.residency(ids[victim]).on_disk
        outputs += run(cm, models, times=2, within_budget=False)
        assert not engine.residency(ids[victim]).on_disk
        assert same(dict(models[victim].named_parameters()), originals[victim])
    assert engine.host_tier.held_bytes() <= engine.host_tier.budget
    assert equal(outputs, expected)


def test_readers_in_one_thread_while_another_runs_the_models(five, tmp_path):
    """One thread reads every model's weights (state_dict, and inside host_weights) over and over while another
    runs them under the budget: every read holds the real values, every output equals the plain run's."""
    cm, models, ids = five
    originals = [weights(model) for model in models]
    expected = without_offload(models, times=6)
    enable(cm, tmp_path)
    errors, outputs = [], []

    def read():
        try:
            for _ in range(5):
                for i, model in enumerate(models):
                    assert same(model.state_dict(), originals[i]), ids[i]
                    with cm.host_weights(ids[i]):
                        assert same(dict(model.named_parameters()), originals[i]), ids[i]
        except Exception as error:  # reported below
            errors.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(6):
        outputs += [model(X) for model in models]
    reader.join()
    assert errors == [] and equal(outputs, expected)
    assert "disk read" in reasons(cm)


def test_host_weights_refuses_an_unknown_id_and_is_a_no_op_without_offload(five):
    cm, models, ids = five
    with pytest.raises(ComponentNotFoundError, match="nope"):
        with cm.host_weights("nope"):
            pass
    with cm.host_weights(ids[0], torch.nn.Linear(1, 1)):  # offload off; an unregistered object is skipped
        pass


def test_saving_a_model_on_disk_writes_its_values(five, tmp_path):
    """A model's own save (what diffusers' and the peer's save_pretrained call) writes real values."""
    cm, models, ids = five
    originals = [weights(model) for model in models]
    enable(cm, tmp_path)
    run(cm, models, times=1)
    victim = on_disk(cm, ids)
    target = tmp_path / "saved.safetensors"
    save_file(models[victim].state_dict(), target)
    assert same(load_file(target), originals[victim])


# ----- a replaced source file -----


def _same_size_and_mtime(path: Path, seed: int, how: str) -> None:
    """Replace ``path`` by other weights of the same size, its modification time set back, as ``how`` does."""
    status = path.stat()
    other = path.with_name("other.safetensors")
    save_file(build(seed).state_dict(), other)
    assert other.stat().st_size == status.st_size
    if how == "cp -p":  # written over the old file: the same inode
        shutil.copyfile(other, path)
    else:  # "rsync -t", "tar x": a new file renamed into place
        os.replace(other, path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert path.stat().st_size == status.st_size and path.stat().st_mtime_ns == status.st_mtime_ns


@pytest.mark.parametrize("how", ["cp -p", "rsync -t"])
def test_a_source_file_replaced_with_the_same_size_and_mtime_is_refused(five, tmp_path, how):
    """Another file of the same size and modification time in place of a dropped model's source: DiskCopyError
    naming the file, never its values read silently into the model."""
    cm, models, ids = five
    enable(cm, tmp_path)
    run(cm, models, times=1)
    victim = on_disk(cm, ids)
    path = tmp_path / f"model{victim}" / "model.safetensors"
    _same_size_and_mtime(path, 50 + victim, how)
    with pytest.raises(DiskCopyError) as caught:
        models[victim](X)
    assert str(path) in str(caught.value) and ids[victim] in str(caught.value)
    assert cm.offload_engine.residency(ids[victim]).on_disk


# ----- removal -----


def test_removing_a_model_whose_file_is_gone_succeeds_and_leaves_no_placeholder(five, tmp_path):
    """After a DiskCopyError, cm.remove unregisters and unhooks the model at once; the weights it held on
    disk only are meta tensors (no NaN placeholder to compute on)."""
    cm, models, ids = five
    enable(cm, tmp_path)
    run(cm, models, times=1)
    victim = on_disk(cm, ids)
    (tmp_path / f"model{victim}" / "model.safetensors").unlink()
    with pytest.raises(DiskCopyError):
        models[victim](X)
    cm.remove(ids[victim])
    assert ids[victim] not in cm and ids[victim] not in cm.offload_engine.attached_ids()
    assert not hasattr(models[victim], "_hf_hook") and "state_dict" not in vars(models[victim])
    assert all(param.device.type == "meta" for param in models[victim].parameters())
    others = [model for i, model in enumerate(models) if i != victim]
    assert equal(run(cm, others, times=1), without_offload(others, times=1))


def test_removing_a_model_on_disk_reads_nothing_unless_held(five, tmp_path):
    """cm.remove of a dropped model reads no byte back; inside host_weights it leaves with its values."""
    cm, models, ids = five
    originals = [weights(model) for model in models]
    expected = without_offload(models, times=1)
    enable(cm, tmp_path)
    run(cm, models, times=1)
    log = cm.offload_log
    first = on_disk(cm, ids)
    read = log.total_bytes_from_disk
    cm.remove(ids[first])
    assert log.total_bytes_from_disk == read and reasons(cm)[-1] != "disk read"
    assert all(tensor.device.type == "meta" for tensor in models[first].parameters())
    second = on_disk(cm, ids)
    with cm.host_weights(ids[second]):
        cm.remove(ids[second])
    assert same(weights(models[second]), originals[second])
    assert torch.equal(models[second](X), expected[second])


def test_an_engine_detach_that_cannot_read_back_changes_nothing(tmp_path):
    """engine.detach (which reads back) with the file gone raises DiskCopyError and leaves the model attached."""
    models = {f"m{i}": loaded(tmp_path / f"m{i}", i) for i in range(3)}
    engine = OffloadEngine(SimulatedDevice(SIZE), memory_reserve_margin=0, host_budget=SIZE)
    for key, model in models.items():
        engine.attach(key, model, [str(tmp_path / key / "model.safetensors")])
    for key in [*models, *models]:
        engine.ensure_resident(key)
    victim = next(key for key in models if engine.residency(key).on_disk)
    (tmp_path / victim / "model.safetensors").unlink()
    with pytest.raises(DiskCopyError):
        engine.detach(victim)
    assert engine.has_hook(victim) and engine.residency(victim).on_disk
    assert hasattr(models[victim], "_hf_hook")


def test_disable_with_a_file_gone_leaves_meta_tensors_not_placeholders(five, tmp_path):
    """disable_auto_cpu_offload reads every model back; one whose file is gone stays registered without its
    weights (meta), and DiskCopyError says so once every model is detached."""
    cm, models, ids = five
    enable(cm, tmp_path)
    run(cm, models, times=1)
    victim = on_disk(cm, ids)
    (tmp_path / f"model{victim}" / "model.safetensors").unlink()
    with pytest.raises(DiskCopyError):
        cm.disable_auto_cpu_offload()
    assert not cm.auto_offload_enabled
    assert all(param.device.type == "meta" for param in models[victim].parameters())
    assert not any(
        param.isnan().any() for i, m in enumerate(models) if i != victim for param in m.parameters()
    )


# ----- spill files and the process -----

_EXITS_WITHOUT_DISABLE = """
import json, os, sys, torch
from components import ComponentsManager
from offload import SimulatedDevice
written = []
for spill in sys.argv[1:]:  # one manager per spill folder ("": a temporary one), each spilling
    models = [torch.nn.Linear(16, 16) for _ in range(4)]  # built in memory: spilled whole
    cm = ComponentsManager()
    for i, model in enumerate(models):
        cm.add(f"model{i}", model)
    size = sum(t.nbytes for t in models[0].parameters())
    several = spill.startswith("devices:")  # a device list: one spill subfolder per device
    spill = spill.removeprefix("devices:")
    device = [SimulatedDevice(size, name=f"sim{i}") for i in range(2)] if several else SimulatedDevice(size)
    cm.enable_auto_cpu_offload(device=device, memory_reserve_margin=0, host_budget=size * (3 if several else 1),
                               spill_folder=spill or None)
    for _ in range(2):
        cm.set_execution_plan(models)
        for model in models:
            model(torch.ones(1, 16))
    tier = cm.offload_engines[0].host_tier
    files = {k: v for engine in cm.offload_engines for k, v in engine.host_tier.spill_files().items()}
    assert files and all(os.path.exists(path) for path in files.values())
    written.append({"folder": tier.spill_folder, "files": list(files.values()), "manager": cm})
print(json.dumps([{key: value for key, value in w.items() if key != "manager"} for w in written]))
sys.stdout.flush()
if os.environ.get("KILL"):
    os._exit(0)  # no atexit, no finalizers: as a process killed outright
"""


def _exit_without_disable(*spill_folders: str, kill: bool = False, tmpdir: str | None = None) -> list[dict]:
    """Run a process that spills into each of ``spill_folders`` ("" for a temporary folder, in ``tmpdir``
    when given) and exits with offload on (``kill``: at once, as if killed); what it wrote, per folder."""
    env = {**os.environ, "KILL": "1" if kill else ""}
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    done = subprocess.run(
        [sys.executable, "-c", _EXITS_WITHOUT_DISABLE, *spill_folders],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_program_that_exits_without_disable_leaves_no_spill_files(tmp_path):
    """A process that spills then exits with offload on: its temporary spill folder is gone, and a spill
    folder given keeps none of its files (and goes, when offload made it; a user's keeps the user's files)."""
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's")
    given, several = tmp_path / "spill", tmp_path / "spill-devices"
    temporary, made, mine, devices = _exit_without_disable("", str(given), str(kept), f"devices:{several}")
    assert temporary["folder"] is not None and not os.path.exists(temporary["folder"])
    assert made["files"] and not any(os.path.exists(path) for path in made["files"])
    assert not given.exists()
    assert mine["files"] and os.listdir(kept) == ["notes.txt"]
    assert devices["files"] and not several.exists()  # its device subfolders, then the folder itself


def test_the_files_a_killed_process_left_are_removed_at_the_next_enable(tmp_path, monkeypatch):
    """Files of a process killed outright stay until the next enable, which removes them (its temporary
    folder too); the files of a live manager sharing the spill folder stay, and it reads them back."""
    spill = tmp_path / "spill"
    spill.mkdir()
    (spill / "notes.txt").write_text("the user's")
    # A temporary directory of this test's own: any enable, in any process (another test worker's), sweeps
    # the dead processes' folders of its temporary directory, and could sweep this one before it is looked at.
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    left, temporary = _exit_without_disable(str(spill), "", kill=True, tmpdir=str(private))
    assert left["files"] and all(os.path.exists(path) for path in left["files"])
    assert os.path.isdir(temporary["folder"])
    # A live manager of this process spills into the same folder.
    live = [build(i) for i in range(3)]
    first = ComponentsManager()
    for i, model in enumerate(live):
        first.add(f"live{i}", model)
    expected = without_offload(live, times=2)
    first.enable_auto_cpu_offload(
        device=SimulatedDevice(SIZE), memory_reserve_margin=0, host_budget=SIZE, spill_folder=spill
    )
    outputs = run(first, live, times=1)
    mine = first.offload_engine.host_tier.spill_files()
    assert mine
    # The next enable on the folder (another manager) sweeps the dead process's files, not the live one's.
    second = ComponentsManager()
    second.add("other", build(9))
    second.enable_auto_cpu_offload(
        device=SimulatedDevice(SIZE), memory_reserve_margin=0, host_budget=SIZE, spill_folder=spill
    )
    assert not any(os.path.exists(path) for path in left["files"]) and not os.path.exists(temporary["folder"])
    assert all(os.path.exists(path) for path in mine.values()) and (spill / "notes.txt").exists()
    outputs += run(first, live, times=1)
    assert equal(outputs, expected)
    first.disable_auto_cpu_offload()
    second.disable_auto_cpu_offload()
    assert os.listdir(spill) == ["notes.txt"]


def test_sweeping_removes_only_what_offload_named_for_a_process_gone(tmp_path):
    """Only files named as offload names them, by a process of this host that no longer runs, are swept."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead, host = int(finished.stdout), spill_files._host()
    stale = f"model-1f.{dead}-{host}.safetensors"
    kept = [
        "model.safetensors",
        f"model-1f.{dead}-otherhost.safetensors",  # another host's process: cannot be seen from here
        f"model-1f.{os.getpid()}-{host}.safetensors",  # a live process's (this one's)
        f"weights.{dead}-{host}.safetensors",  # not named as offload names its files
        "notes.txt",
    ]
    for name in [stale, *kept]:
        (tmp_path / name).write_text("x")
    assert sweep_stale(str(tmp_path)) == [str(tmp_path / stale)]
    assert sorted(os.listdir(tmp_path)) == sorted(kept)


def test_a_tier_collected_unclosed_removes_its_files(tmp_path):
    """An engine dropped without close (no disable) removes its spill files when it is collected."""
    models = [build(i) for i in range(3)]
    engine = OffloadEngine(SimulatedDevice(SIZE), memory_reserve_margin=0, host_budget=SIZE)
    for i, model in enumerate(models):
        engine.attach(f"m{i}", model)
    for key in ["m0", "m1", "m2", "m0"]:
        engine.ensure_resident(key)
    folder = engine.host_tier.spill_folder
    assert folder is not None and os.listdir(folder)
    del engine
    for model in models:  # the hooks refer to the engine
        remove_hook(model)
    gc.collect()
    assert not os.path.exists(folder)
