"""The host tier: host copies kept within a budget, the rest read back from safetensors files or a spill."""

import os
import threading

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import offload.host.host_budget
from components import ComponentsManager, tag_load_id
from components.table import device_cell
from offload import DiskCopyError, HostBudgetError, OffloadEngine, SimulatedDevice, module_nbytes
from offload.host.tensor_slots import drop_tensors, tensor_slots

from .helpers import MetaProbe, check_host_copies_fit

WIDTH = 16


def build(seed: int) -> torch.nn.Sequential:
    """A small MLP with random weights; every model of one width has the same size."""
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 4))
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        torch.nn.init.normal_(param, generator=generator)
    return model


def loaded(folder, seed: int) -> torch.nn.Sequential:
    """A model saved to ``folder/model.safetensors`` and loaded back from it, tagged with its load ID."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.safetensors")
    save_file(build(seed).state_dict(), path)
    model = build(99)
    model.load_state_dict(load_file(path))
    tag_load_id(model, f"{folder}|null|null|null")
    return model


SIZE = module_nbytes(build(0))
X = torch.ones(1, WIDTH)


def run(cm, models, times=2, within_budget=True):
    """Call the models as a pipeline would, ``times`` calls; returns every output. With ``within_budget``,
    check after each model call that the host copies held fit the host budget."""
    outputs = []
    for _ in range(times):
        cm.set_execution_plan(models)
        for model in models:
            outputs.append(model(X))
            if not within_budget:
                continue
            check_host_copies_fit(cm.offload_engine)
    return outputs


def without_offload(models, times=2):
    return [model(X) for _ in range(times) for model in models]


def equal(outputs, expected):
    return len(outputs) == len(expected) and all(torch.equal(a, b) for a, b in zip(outputs, expected))


def enable(cm, tmp_path, budget=2 * SIZE, device=SIZE):
    spill = tmp_path / "spill"
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(device), memory_reserve_margin=0, host_budget=budget, spill_folder=spill
    )
    return spill


def reasons(cm):
    return [decision.reason for decision in cm.offload_log]


def test_a_budget_for_two_of_five_models_reads_unchanged_ones_back_from_their_files(five, tmp_path):
    """Host copies for two of five models: outputs equal, disk reads in the log, nothing written to disk."""
    cm, models, ids = five
    expected = without_offload(models)
    spill = enable(cm, tmp_path)
    assert equal(run(cm, models), expected)
    log = cm.offload_log
    assert reasons(cm).count("disk read") >= 5 and log.total_bytes_from_disk >= 5 * SIZE
    assert log.total_bytes_to_disk == 0 and "spill" not in reasons(cm)
    assert os.listdir(spill) == [] and cm.offload_engine.host_tier.spill_files() == {}
    assert cm.offload_engine.host_tier.held_bytes() <= 2 * SIZE
    assert "from disk" in str(log) and "disk read" in str(log)


def test_the_table_and_model_info_show_where_the_weights_are(five, tmp_path):
    """Device, host, disk: the device cell and get_model_info say which, with the real size on disk."""
    cm, models, ids = five
    enable(cm, tmp_path)
    run(cm, models, times=1)
    engine = cm.offload_engine
    cells = {device_cell(engine.residency(model_id)) for model_id in ids}
    assert cells == {"sim(sim)", "cpu(sim)", "disk(sim)"}
    on_disk = [model_id for model_id in ids if engine.residency(model_id).on_disk]
    info = cm.get_model_info(on_disk[0])
    assert info["device"] == "disk" and info["size_gb"] * 1024**3 == pytest.approx(SIZE)
    assert "disk(sim)" in cm.table()


def test_a_model_changed_in_memory_is_spilled_once(five, tmp_path):
    """An edited model (refresh_host_copy) writes only its changed tensor, once; outputs follow the edit."""
    cm, models, ids = five
    spill = enable(cm, tmp_path)
    run(cm, models, times=1)
    cm.offload_engine.load_host_copy(ids[1])
    with torch.no_grad():
        models[1][0].weight.mul_(2)
    cm.refresh_host_copy(ids[1])
    cm.disable_auto_cpu_offload()
    expected = without_offload(models, times=3)
    spill = enable(cm, tmp_path)
    cm.refresh_host_copy(cm.get_id(models[1]))  # the edit happened before this engine: say so
    assert equal(run(cm, models, times=3), expected)
    assert reasons(cm).count("spill") == 1
    files = cm.offload_engine.host_tier.spill_files()
    assert list(files) == [cm.get_id(models[1])] and os.listdir(spill) == [os.path.basename(files[ids[1]])]
    with safe_open(files[ids[1]], framework="pt") as handle:
        assert list(handle.keys()) == ["0.weight"]  # the other tensors are read from the source file


def test_an_edit_under_offload_is_kept(five, tmp_path):
    """An edit made while offload runs (load_host_copy, edit, refresh_host_copy) survives later drops."""
    cm, models, ids = five
    enable(cm, tmp_path)
    run(cm, models, times=1)
    cm.offload_engine.load_host_copy(ids[3])
    with torch.no_grad():
        models[3][2].bias.add_(1)
    cm.refresh_host_copy(ids[3])
    after = [model(X) for model in models]
    assert equal(run(cm, models, times=2), after * 2)
    assert reasons(cm).count("spill") == 1
    cm.disable_auto_cpu_offload()
    assert equal(without_offload(models, times=1), after)


def test_a_model_built_in_memory_spills_whole_once(tmp_path):
    """A model with no file (no load ID) is written whole to the spill folder once, then read from it."""
    models = [build(i) for i in range(4)]
    expected = without_offload(models, times=3)
    cm = ComponentsManager()
    ids = [cm.add(f"model{i}", model) for i, model in enumerate(models)]
    enable(cm, tmp_path)
    assert equal(run(cm, models, times=3), expected)
    spilled = [d.model_id for d in cm.offload_log if d.reason == "spill"]
    assert sorted(spilled) == sorted(set(spilled)) and len(spilled) >= 2
    assert all(d.bytes_to_disk == SIZE for d in cm.offload_log if d.reason == "spill")
    assert set(cm.offload_engine.host_tier.spill_files()) == set(spilled) <= set(ids)


def test_disable_reads_every_model_back_and_removes_the_spill_files(tmp_path):
    """After disable, every weight is real again (outputs equal) and the temporary spill folder is gone."""
    models = [build(i) for i in range(4)]
    expected = without_offload(models, times=1)
    cm = ComponentsManager()
    for i, model in enumerate(models):
        cm.add(f"model{i}", model)
    cm.enable_auto_cpu_offload(device=SimulatedDevice(SIZE), memory_reserve_margin=0, host_budget=SIZE)
    run(cm, models, times=1)
    folder = cm.offload_engine.host_tier.spill_folder
    assert folder is not None and os.listdir(folder)
    cm.disable_auto_cpu_offload()
    assert not os.path.exists(folder)
    assert equal(without_offload(models, times=1), expected)
    assert all(tensor.isfinite().all() for model in models for tensor in model.state_dict().values())


def test_host_budget_smaller_than_a_model_without_a_file_is_refused(five, tmp_path):
    """A model larger than host_budget with nothing to read it back from: refused, nothing dropped."""
    cm, models, ids = five
    expected = without_offload(models, times=1)
    big = build(7)
    big_id = cm.add("big", big)
    with pytest.raises(HostBudgetError) as caught:
        enable(cm, tmp_path, budget=SIZE // 2, device=2 * SIZE)
    message = str(caught.value)
    assert big_id in message and "host_budget" in message and "Raise host_budget" in message
    assert "680 B" in message and "1360 B" in message  # the budget and the model's size
    assert not cm.auto_offload_enabled and not os.path.exists(tmp_path / "spill" / "x")
    assert equal(without_offload(models, times=1), expected)
    # The same budget without that model: the others are read from their files each time they are needed.
    cm.remove(big_id)
    enable(cm, tmp_path, budget=SIZE // 2, device=2 * SIZE)
    assert equal(run(cm, models, times=2), without_offload(models))
    assert cm.offload_log.total_bytes_to_disk == 0


def test_adding_a_model_the_budget_cannot_hold_is_refused(five, tmp_path):
    """Under a host budget, add() of a model larger than it and without a file raises and registers nothing."""
    cm, models, ids = five
    enable(cm, tmp_path, budget=SIZE // 2, device=2 * SIZE)
    with pytest.raises(HostBudgetError, match="no safetensors file"):
        cm.add("big", build(7))
    assert len(cm) == 5 and cm.offload_engine.attached_ids() == ids


@pytest.mark.parametrize("several", [False, True], ids=["one device", "a device list"])
def test_a_spill_folder_that_is_not_writable_is_refused_before_anything_is_dropped(five, tmp_path, several):
    """spill_folder under a regular file: HostBudgetError names it; the previous offload stays as it was."""
    cm, models, ids = five
    cm.enable_auto_cpu_offload(device=SimulatedDevice(2 * SIZE), memory_reserve_margin=0)
    previous = cm.offload_engine
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    devices = [SimulatedDevice(SIZE, name=f"sim{i}") for i in range(2)] if several else SimulatedDevice(SIZE)
    with pytest.raises(HostBudgetError, match="not a writable folder") as caught:
        cm.enable_auto_cpu_offload(
            device=devices, memory_reserve_margin=0, host_budget=SIZE, spill_folder=blocker / "spill"
        )
    assert str(blocker / "spill") in str(caught.value) and "Nothing was dropped." in str(caught.value)
    assert cm.offload_engines == [previous] and previous.attached_ids() == ids
    assert not any(previous.residency(model_id).on_disk for model_id in ids)


def test_a_spill_that_fails_later_keeps_the_host_copy(tmp_path):
    """When the spill folder stops being writable, the model keeps its host copy: nothing is lost."""
    models = [build(i) for i in range(3)]
    expected = without_offload(models)
    cm = ComponentsManager()
    for i, model in enumerate(models):
        cm.add(f"model{i}", model)
    spill = enable(cm, tmp_path, budget=SIZE)
    spill.rmdir()
    spill.write_text("the folder is gone")
    assert equal(run(cm, models, within_budget=False), expected)
    assert "spill" not in reasons(cm) and "drop host copy" not in reasons(cm)


def test_a_source_file_gone_after_the_drop_is_a_clear_error(five, tmp_path):
    """A file deleted after its model dropped the host copy: DiskCopyError names the model and the file."""
    cm, models, ids = five
    enable(cm, tmp_path)
    run(cm, models, times=1)
    engine = cm.offload_engine
    victim = next(i for i, model_id in enumerate(ids) if engine.residency(model_id).on_disk)
    path = tmp_path / f"model{victim}" / "model.safetensors"
    path.unlink()
    with pytest.raises(DiskCopyError) as caught:
        models[victim](X)
    assert ids[victim] in str(caught.value) and str(path) in str(caught.value)
    assert engine.residency(ids[victim]).on_disk
    with pytest.raises(DiskCopyError):
        cm.disable_auto_cpu_offload()
    assert not cm.auto_offload_enabled  # detached all the same


def test_two_pipelines_in_threads_share_the_budget(five, tmp_path):
    """Two threads run overlapping model sets under one host budget; each gets its outputs unchanged."""
    cm, models, ids = five
    first, second = models[:3], models[2:]
    expected = {0: without_offload(first, times=3), 1: without_offload(second, times=3)}
    enable(cm, tmp_path, budget=2 * SIZE, device=2 * SIZE)
    results, errors = {}, []

    def work(index, group):
        try:
            results[index] = [model(X) for _ in range(3) for model in group]
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i, group)) for i, group in enumerate([first, second])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert equal(results[0], expected[0]) and equal(results[1], expected[1])
    assert "disk read" in reasons(cm) and cm.offload_log.total_bytes_to_disk == 0


def test_weights_are_read_back_before_they_move_to_the_device(tmp_path):
    """On a device the ledger copies to (a meta device here), a dropped model is read back, then uploaded."""
    models = {f"m{i}": loaded(tmp_path / f"m{i}", i) for i in range(3)}
    originals = {key: {k: v.clone() for k, v in model.state_dict().items()} for key, model in models.items()}
    engine = OffloadEngine(MetaProbe(SIZE), memory_reserve_margin=0, host_budget=SIZE)
    for key, model in models.items():
        engine.attach(key, model, [str(tmp_path / key / "model.safetensors")])
    for key in [*models, *models]:
        engine.ensure_resident(key)
        assert all(p.device.type == "meta" for p in models[key].parameters())
    assert engine.log.total_bytes_from_disk >= 2 * SIZE
    engine.close()
    for key, model in models.items():
        assert all(torch.equal(v, originals[key][k]) for k, v in model.state_dict().items())


def test_tied_weights_stay_tied_after_a_read_back():
    """A weight shared by two modules is dropped and read back as one tensor."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model[1].weight = model[0].weight
    slots = tensor_slots(model)
    assert not isinstance(slots, str) and len(slots) == 3
    tied = next(slot for slot in slots if len(slot.places) == 2)
    assert tied.names == ["0.weight", "1.weight"]
    drop_tensors(slots)
    assert model[0].weight.untyped_storage().nbytes() == 4 and model[0].weight.isnan().all()


def test_the_default_budget_is_what_the_host_has_available_less_a_margin(monkeypatch):
    """No host_budget: the host's available memory, less a tenth of its total."""
    monkeypatch.setattr(offload.host.host_budget, "host_memory", lambda: (8 * 2**30, 16 * 2**30))
    engine = OffloadEngine(SimulatedDevice(SIZE), memory_reserve_margin=0)
    assert engine.host_tier.budget == 8 * 2**30 - int(16 * 2**30 * 0.1)


def test_bad_host_budget_arguments_are_refused():
    """A host budget with device='cpu', or one that is not a size, raises before anything is built."""
    with pytest.raises(ValueError, match="device='cpu'"):
        OffloadEngine("cpu", host_budget="1GB")
    with pytest.raises(ValueError, match="host_budget"):
        OffloadEngine(SimulatedDevice(SIZE), host_budget="lots")
    with pytest.raises(TypeError, match="host_budget"):
        OffloadEngine(SimulatedDevice(SIZE), host_budget=1.5)
