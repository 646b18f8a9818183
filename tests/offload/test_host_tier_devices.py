"""One host budget over several devices: split between the engines by the bytes each places, one spill subfolder
per device, the same refusals as on one device."""

import os
import threading

import pytest

import offload.host.host_budget
from components import ComponentsManager
from offload import HostBudgetError, NextUseStrategy, SimulatedDevice

from .helpers import check_host_copies_fit
from .test_host_tier import SIZE, X, build, equal, loaded, without_offload


def two_devices(room=SIZE):
    return [SimulatedDevice(room, name="sim0"), SimulatedDevice(room, name="sim1")]


def enable(cm, budget, spill=None, strategy=None, room=SIZE):
    cm.enable_auto_cpu_offload(
        device=two_devices(room),
        memory_reserve_margin=0,
        host_budget=budget,
        spill_folder=spill,
        offload_strategy=strategy,
    )
    return cm.offload_engines


def run(cm, models, times=2, check_from=1):
    """Call ``models`` as a pipeline would, ``times`` calls; from call ``check_from`` on (once every device
    has placed a model and so held its share), check after each model call that each engine's host copies
    fit its share and all of them the budget (beyond only by what is on the simulated devices)."""
    outputs = []
    for time in range(times):
        cm.set_execution_plan(models)
        for model in models:
            outputs.append(model(X))
            if time < check_from:
                continue
            on_device = []
            for engine in cm.offload_engines:
                on_device.append(check_host_copies_fit(engine))
            held = sum(engine.host_tier.held_bytes() for engine in cm.offload_engines)
            assert held <= max(cm.offload_engines[0].host_tier.share.budget, sum(on_device))
    return outputs


def reasons(engine):
    return [decision.reason for decision in engine.log]


def shares(cm):
    return [engine.host_tier.budget for engine in cm.offload_engines]


class ByName(NextUseStrategy):
    """Evicts as NextUseStrategy does; models whose id starts with ``s1`` go to the last device, the others
    to the first."""

    def choose_devices(self, models, devices):
        return {m: devices[-1].index if m.startswith("s1") else devices[0].index for m in models}


def test_a_budget_for_two_of_five_models_on_two_devices_reads_them_back_from_their_files(five, tmp_path):
    """Host copies for two of five models over two devices: outputs equal, disk reads on both, nothing written."""
    cm, models, ids = five
    expected = without_offload(models, times=3)
    sim0, sim1 = enable(cm, 2 * SIZE, tmp_path / "spill")
    # DenoiserFirst, equal sizes, one model's room each: model0, 2, 4 on sim0; model1, 3 on sim1.
    assert sim0.attached_ids() == ids[0::2] and sim1.attached_ids() == ids[1::2]
    assert shares(cm) == [2 * SIZE * 3 // 5, 2 * SIZE * 2 // 5]
    assert equal(run(cm, models, times=3), expected)
    for engine in (sim0, sim1):
        assert "disk read" in reasons(engine) and engine.log.total_bytes_from_disk >= SIZE
        assert engine.log.total_bytes_to_disk == 0 and "spill" not in reasons(engine)
        assert engine.host_tier.spill_files() == {}
    assert sorted(os.listdir(tmp_path / "spill")) == ["0-sim0", "1-sim1"]
    assert all(os.listdir(tmp_path / "spill" / sub) == [] for sub in ("0-sim0", "1-sim1"))
    cm.disable_auto_cpu_offload()
    assert equal(without_offload(models, times=1), expected[:5])


def test_each_device_spills_to_its_own_subfolder(tmp_path):
    """Models built in memory spill once each, into their device's subfolder; disable removes the folder."""
    models = [build(i) for i in range(5)]
    expected = without_offload(models, times=3)
    cm = ComponentsManager()
    ids = [cm.add(f"model{i}", model) for i, model in enumerate(models)]
    spill = tmp_path / "spill"
    engines = enable(cm, 3 * SIZE, spill)
    assert equal(run(cm, models, times=3), expected)
    for index, engine in enumerate(engines):
        files = engine.host_tier.spill_files()
        spilled = [decision.model_id for decision in engine.log if decision.reason == "spill"]
        assert files and sorted(spilled) == sorted(files)  # each model spilled once, by its own engine
        assert set(files) <= set(engine.attached_ids())
        folder = spill / f"{index}-sim{index}"
        assert sorted(os.listdir(folder)) == sorted(os.path.basename(path) for path in files.values())
    cm.disable_auto_cpu_offload()
    assert not os.path.exists(spill)  # made by offload, emptied and removed at disable
    assert equal(without_offload(models, times=1), expected[:5]) and len(ids) == 5


def test_enabling_again_on_the_same_spill_folder_spills_there_and_leaves_nothing(tmp_path):
    """Offload enabled again with the same spill folder: the new engines spill into their subfolders, and
    disable removes what offload made."""
    models = [build(i) for i in range(5)]
    expected = without_offload(models, times=2)
    cm = ComponentsManager()
    for i, model in enumerate(models):
        cm.add(f"model{i}", model)
    spill = tmp_path / "spill"
    enable(cm, 3 * SIZE, spill)
    run(cm, models, times=1)
    engines = enable(cm, 3 * SIZE, spill)  # the engines it replaces remove their files first
    assert equal(run(cm, models), expected)
    for index, engine in enumerate(engines):
        assert engine.host_tier.spill_files()
        assert all(
            os.path.dirname(path) == str(spill / f"{index}-sim{index}")
            for path in engine.host_tier.spill_files().values()
        )
        assert all(os.path.exists(path) for path in engine.host_tier.spill_files().values())
    cm.disable_auto_cpu_offload()
    assert not os.path.exists(spill)


def test_a_model_larger_than_its_share_without_a_file_is_refused(five, tmp_path):
    """A model with no file larger than its device's share: HostBudgetError naming it, the share, the budget
    and the budget that would hold it; offload left as it was. One device with the same budget holds it."""
    cm, models, ids = five
    big = build(7)
    big_id = cm.add("big", big)  # the sixth model: sim1's (DenoiserFirst), 3 of the 6 models' bytes
    cm.enable_auto_cpu_offload(device=SimulatedDevice(SIZE), memory_reserve_margin=0)
    before = cm.offload_engine
    with pytest.raises(HostBudgetError) as caught:
        enable(cm, 3 * SIZE // 2, tmp_path / "spill")
    message = str(caught.value)
    assert message.startswith(
        f"model {big_id!r} (1360 B) is larger than sim1's share 1020 B of host_budget 2040 B"
    )
    assert "sim1 places 4080 B" in message and "no safetensors file it was loaded from" in message
    assert "Raise host_budget to at least 2720 B" in message and "Nothing was dropped." in message
    assert cm.offload_engines == [before] and big._hf_hook.engine is before
    assert not os.path.exists(tmp_path / "spill")
    # At the budget the message names, the split holds it.
    enable(cm, 2 * SIZE, tmp_path / "spill")
    assert shares(cm) == [SIZE, SIZE]
    assert equal(run(cm, [*models, big]), without_offload([*models, big]))


def test_adding_a_model_that_outgrows_its_share_is_refused(five):
    """add() of a model with no file larger than its device's new share raises; shares and engines unchanged."""
    cm, models, ids = five
    sim0, sim1 = enable(cm, 3 * SIZE // 2)
    before = shares(cm)
    with pytest.raises(HostBudgetError, match=r"larger than sim1's share 1020 B of host_budget 2040 B"):
        cm.add("built", build(7))
    assert len(cm) == 5 and shares(cm) == before
    assert sim0.attached_ids() == ids[0::2] and sim1.attached_ids() == ids[1::2]


def test_a_model_added_to_one_device_may_not_shrink_another_below_its_models(tmp_path):
    """A new model on sim0 would shrink sim1's share below its model with no file: refused, naming that one."""
    cm = ComponentsManager()
    first = loaded(tmp_path / "first", 0)
    cm.add("first", first)
    built_id = cm.add("s1_built", build(1))
    enable(cm, 2 * SIZE, strategy=ByName())
    assert shares(cm) == [SIZE, SIZE]
    second = loaded(tmp_path / "second", 2)
    with pytest.raises(HostBudgetError) as caught:
        cm.add("second", second)  # sim0 would place 2 of the 3 models' bytes, leaving sim1 2/3 of SIZE
    assert str(caught.value).startswith(f"model {built_id!r} (1360 B) is larger than sim1's share 906 B")
    assert "Raise host_budget to at least 4080 B" in str(caught.value)
    assert len(cm) == 2 and shares(cm) == [SIZE, SIZE] and not hasattr(second, "_hf_hook")


def test_a_share_that_shrinks_drops_copies_at_once_and_one_that_grows_back_drops_none(tmp_path):
    """Adding a model to sim0 shrinks sim1's share: sim1 drops an idle copy then, not at its next placement.
    Removing it gives the share back. Outputs stay equal throughout."""
    cm = ComponentsManager()
    a = loaded(tmp_path / "a", 0)
    b, c = (loaded(tmp_path / f"s1_{i}", i) for i in (1, 2))
    models = [a, b, c]
    cm.add("a", a)
    b_id, c_id = cm.add("s1_b", b), cm.add("s1_c", c)
    expected = without_offload(models)
    sim0, sim1 = enable(cm, 3 * SIZE, strategy=ByName())
    assert shares(cm) == [SIZE, 2 * SIZE]
    run(cm, models, times=1)
    assert sim1.resident_ids() == [c_id] and not sim1.residency(b_id).on_disk  # b held within 2 * SIZE
    d = loaded(tmp_path / "d", 3)
    d_id = cm.add("d", d)
    assert shares(cm) == [3 * SIZE // 2, 3 * SIZE // 2]
    assert sim1.residency(b_id).on_disk and sim1.log[-1].reason == "drop host copy"
    assert equal(run(cm, models), expected)
    dropped = len(sim1.log)
    cm.remove(d_id)
    assert shares(cm) == [SIZE, 2 * SIZE] and len(sim1.log) == dropped
    assert equal(run(cm, models), expected)


def test_the_default_budget_is_one_budget_split_between_the_devices(five, monkeypatch):
    """host_budget=None: the host's available memory less a tenth of it, once, split by the bytes placed."""
    cm, models, ids = five
    monkeypatch.setattr(offload.host.host_budget, "host_memory", lambda: (8 * 2**30, 16 * 2**30))
    enable(cm, None)
    whole = 8 * 2**30 - int(16 * 2**30 * 0.1)
    assert shares(cm) == [whole * 3 // 5, whole * 2 // 5]
    assert all(engine.host_tier.share.budget == whole for engine in cm.offload_engines)


def test_bad_host_budget_with_a_device_list_is_refused():
    """A host budget that is not a size, with a device list: refused before any engine is built."""
    cm = ComponentsManager()
    module = build(0)
    cm.add("model", module)
    with pytest.raises(ValueError, match="host_budget"):
        enable(cm, "lots")
    with pytest.raises(TypeError, match="host_budget"):
        enable(cm, 1.5)
    assert not cm.auto_offload_enabled and not hasattr(module, "_hf_hook")


def test_two_devices_run_in_threads_while_models_come_and_go(five, tmp_path):
    """Two threads run their device's models under one budget while the main thread adds and removes a
    model (every share set again, drops under each engine's lock in turn): no deadlock, outputs equal."""
    cm, models, ids = five
    groups = [models[0::2], models[1::2]]  # sim0's and sim1's
    expected = [without_offload(group, times=20) for group in groups]
    enable(cm, 2 * SIZE, tmp_path / "spill")
    results, errors = {}, []

    def work(index):
        try:
            results[index] = [model(X) for _ in range(20) for model in groups[index]]
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for step in range(8):
        extra_id = cm.add("extra", loaded(tmp_path / f"extra{step}", 10 + step))
        cm.remove(extra_id)
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads) and errors == []
    assert equal(results[0], expected[0]) and equal(results[1], expected[1])
    assert all("disk read" in reasons(engine) for engine in cm.offload_engines)
    assert all(engine.log.total_bytes_to_disk == 0 for engine in cm.offload_engines)
