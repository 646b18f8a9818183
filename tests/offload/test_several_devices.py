"""Auto offload over several devices: one engine per device, each model placed by the one a rule picks."""

import threading
from types import SimpleNamespace

import pytest
import torch

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from offload import (
    MergedOffloadLog,
    ModelTooLargeError,
    NextUseStrategy,
    OffloadLog,
    SimulatedDevice,
    StrategyError,
    WatermarkStrategy,
    module_nbytes,
)
from offload.devices.device_choice import DenoiserFirst, DeviceRoom

from ..modular.tiny_sd import tiny_sd_images, tiny_sd_pipeline
from .helpers import call, sized


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repos")
    return make_tiny_repo(folder / "a"), make_tiny_repo(folder / "b")


def two_devices(budget, first="sim0", second="sim1"):
    return [SimulatedDevice(budget, name=first), SimulatedDevice(budget, name=second)]


def engine_placing(cm, module):
    """The engine whose hook is on ``module``."""
    component_id = cm.get_id(module)
    (engine,) = [engine for engine in cm.offload_engines if engine.has_hook(component_id)]
    return engine


def device_cells(cm):
    """``{model id: device cell}`` read from ``print(cm)``'s model rows."""
    rows = [[cell.strip() for cell in line.split("|")] for line in cm.table().splitlines() if " | " in line]
    return {row[0]: row[2] for row in rows if row[0] in cm}


def test_pipeline_too_big_for_one_device_runs_across_two_with_equal_outputs(repos):
    """Models that do not fit one device run across two: bit-equal images, both devices in table and logs."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repos[0], cm)
    expected = tiny_sd_images(pipe)
    unet, text_encoder, vae = pipe.unet, pipe.text_encoder, pipe.vae
    budget = module_nbytes(unet) + module_nbytes(text_encoder)  # the three do not fit one device
    assert budget < module_nbytes(unet) + module_nbytes(text_encoder) + module_nbytes(vae)
    cm.enable_auto_cpu_offload(device=two_devices(budget), memory_reserve_margin=0)
    sim0, sim1 = cm.offload_engines
    for _ in range(2):
        assert torch.equal(tiny_sd_images(pipe), expected)
    # The denoiser and the text encoder that fits beside it on sim0, the VAE on the next device.
    assert engine_placing(cm, unet) is sim0 and engine_placing(cm, text_encoder) is sim0
    assert engine_placing(cm, vae) is sim1
    assert {decision.model_id for decision in sim0.log} == {cm.get_id(unet), cm.get_id(text_encoder)}
    assert [decision.model_id for decision in sim1.log] == [cm.get_id(vae)]
    assert all(
        not engine.log.total_evictions and not engine.log.total_bytes_to_host for engine in (sim0, sim1)
    )
    cells = device_cells(cm)
    assert cells[cm.get_id(unet)] == cells[cm.get_id(text_encoder)] == "sim0(sim0)"
    assert cells[cm.get_id(vae)] == "sim1(sim1)"
    assert cm.get_model_info(cm.get_id(vae), "execution_device") == {"execution_device": torch.device("cpu")}
    cm.disable_auto_cpu_offload()
    assert cm.offload_engines == [] and all(not hasattr(m, "_hf_hook") for m in (unet, text_encoder, vae))


def test_two_pipelines_run_on_different_devices_in_two_threads(repos):
    """Two pipelines whose models land on different devices run at once in two threads, each bit-equal."""
    cm = ComponentsManager()
    pipes = [tiny_sd_pipeline(repo, cm) for repo in repos]
    expected = [tiny_sd_images(pipe) for pipe in pipes]
    budget = sum(module_nbytes(m) for m in (pipes[0].unet, pipes[0].text_encoder, pipes[0].vae))
    cm.enable_auto_cpu_offload(device=two_devices(budget), memory_reserve_margin=0)
    for pipe, engine in zip(pipes, cm.offload_engines):
        assert {engine_placing(cm, m) for m in (pipe.unet, pipe.text_encoder, pipe.vae)} == {engine}
    results, errors = {}, []

    def work(index):
        try:
            results[index] = [tiny_sd_images(pipes[index]) for _ in range(2)]
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for index in range(2):
        assert all(torch.equal(images, expected[index]) for images in results[index])
    assert all(engine.log.total_evictions == 0 for engine in cm.offload_engines)
    cm.disable_auto_cpu_offload()


def test_each_engine_gets_the_plan_restricted_to_its_models():
    """set_execution_plan passes each engine only its own models, in order; an engine with none gets nothing."""
    cm = ComponentsManager()
    big, small, other = sized(4000), sized(1000), sized(2000)
    ids = [cm.add(name, m) for name, m in [("big", big), ("small", small), ("other", other)]]
    cm.enable_auto_cpu_offload(device=two_devices(5000), memory_reserve_margin=0)
    seen = {engine.probe.name: [] for engine in cm.offload_engines}
    for engine in cm.offload_engines:
        engine.watchers.append(lambda kind, value, name=engine.probe.name: seen[name].append((kind, value)))
    cm.set_execution_plan([small, big, other])
    cm.set_execution_plan([other])
    # big (4000) on sim0, small beside it (1000 left), other (2000) on sim1.
    assert seen["sim0"] == [("plan", (ids[1], ids[0]))]
    assert seen["sim1"] == [("plan", (ids[2],)), ("plan", (ids[2],))]


def test_a_model_added_later_goes_where_there_is_most_room():
    """With offload on over two devices, a new model goes to the device with the most room left."""
    cm = ComponentsManager()
    first = sized(3000)
    cm.add("first", first)
    cm.enable_auto_cpu_offload(device=two_devices(5000), memory_reserve_margin=0)
    late = sized(2000)
    late_id = cm.add("late", late)
    assert engine_placing(cm, first) is cm.offload_engines[0]
    assert engine_placing(cm, late) is cm.offload_engines[1]
    call(late)
    assert cm.offload_engines[1].resident_ids() == [late_id]
    cm.remove(late_id)
    assert not hasattr(late, "_hf_hook") and not cm.offload_engines[1].attached_ids()


def test_the_default_rule_puts_the_largest_where_there_is_most_room_and_the_rest_beside_or_next():
    """DenoiserFirst: the largest to the roomiest device, each next one beside it, else onward, else roomiest."""
    rooms = [DeviceRoom(0, "a", 10, assigned=6), DeviceRoom(1, "b", 10), DeviceRoom(2, "c", 10)]
    models = {"te": 3, "unet": 8, "vae": 2, "huge": 20}
    # huge -> b (most room: 10); unet -> not beside b (-10), c; vae -> c (2 left), te -> a (4 left).
    assert DenoiserFirst().choose_devices(models, rooms) == {"huge": 1, "unet": 2, "vae": 2, "te": 0}


class OnTheLast(NextUseStrategy):
    """A strategy that also chooses devices: every model on the last device."""

    def choose_devices(self, models, devices):
        return {model_id: devices[-1].index for model_id in models}


def test_a_strategy_with_choose_devices_supplies_the_rule():
    """A strategy that has choose_devices decides where each model goes, at enable and for later models."""
    cm = ComponentsManager()
    first = sized(1000)
    cm.add("first", first)
    cm.enable_auto_cpu_offload(
        device=two_devices(5000), memory_reserve_margin=0, offload_strategy=OnTheLast()
    )
    later = sized(1000)
    cm.add("later", later)
    assert (
        engine_placing(cm, first) is cm.offload_engines[1]
        and engine_placing(cm, later) is cm.offload_engines[1]
    )
    assert all(isinstance(engine.strategy, OnTheLast) for engine in cm.offload_engines)


class Nowhere(NextUseStrategy):
    """A device rule that answers a device that is not in the list."""

    def choose_devices(self, models, devices):
        return {model_id: 7 for model_id in models}


def test_offload_engine_with_several_devices_names_offload_engines_and_the_manager_log():
    """offload_engine refuses to pick one engine of several (its settings would cover one device): the error
    names offload_engines and offload_log; one device keeps offload_engine and its log."""
    cm = ComponentsManager()
    cm.add("model", sized(1000))
    cm.enable_auto_cpu_offload(device=two_devices(5000), memory_reserve_margin=0)
    with pytest.raises(RuntimeError) as error:
        _ = cm.offload_engine
    assert str(error.value) == (
        "auto offload runs on 2 devices ['sim0', 'sim1'], one engine each: read offload_engines (set a setting "
        "on each, e.g. `for engine in cm.offload_engines: engine.prefetch = True`; engine.has_hook(component_id) "
        "finds a model's). offload_log holds every engine's decisions."
    )
    cm.enable_auto_cpu_offload(device=[SimulatedDevice(5000, name="only")], memory_reserve_margin=0)
    assert cm.offload_engines == [cm.offload_engine] and cm.offload_log is cm.offload_engine.log
    assert isinstance(cm.offload_log, OffloadLog)


def test_the_manager_log_holds_every_engines_decisions_in_order_each_with_its_device():
    """With several devices cm.offload_log is one log: the decisions of both engines in the order they were
    made (not device by device), each naming its device; totals add up; the table shows the devices."""
    cm = ComponentsManager()
    big, small, other = sized(4000), sized(1000), sized(2000)
    ids = {name: cm.add(name, m) for name, m in [("big", big), ("small", small), ("other", other)]}
    cm.enable_auto_cpu_offload(device=two_devices(5000), memory_reserve_margin=0)
    sim0, sim1 = cm.offload_engines
    for module in (other, big, other, small):  # big and small on sim0, other on sim1
        call(module)
    sim0.evict(ids["big"])
    log = cm.offload_log
    assert isinstance(log, MergedOffloadLog) and cm.offload_log is log
    assert [(d.device, d.model_id, d.reason) for d in log] == [
        ("sim1", ids["other"], "fits"),
        ("sim0", ids["big"], "fits"),
        ("sim0", ids["small"], "fits"),
        ("sim0", ids["big"], "evict"),
    ]
    assert len(log) == 4 and log[1].model_id == ids["big"] and log[-1].reason == "evict"
    assert (
        log.total_bytes_to_device == 7000 == sim0.log.total_bytes_to_device + sim1.log.total_bytes_to_device
    )
    assert (log.total_evictions, log.total_shrinks, log.total_left_device, log.total_bytes_to_host) == (
        1,
        0,
        1,
        0,
    )
    lines = str(log).splitlines()
    assert [cell.strip() for cell in lines[0].split(" | ")][:3] == ["#", "device", "model"]
    assert [[cell.strip() for cell in line.split(" | ")][:3] for line in lines[2:6]] == [
        ["1", "sim1", ids["other"]],
        ["2", "sim0", ids["big"]],
        ["3", "sim0", ids["small"]],
        ["4", "sim0", ids["big"]],
    ]
    assert lines[6:] == [
        "total: to device 7000 B, to host 0 B, left the device 1 (1 whole, 0 shrunk to a prefix)",
        "  sim0: to device 5000 B, to host 0 B, left the device 1 (1 whole, 0 shrunk to a prefix)",
        "  sim1: to device 2000 B, to host 0 B, left the device 0 (0 whole, 0 shrunk to a prefix)",
    ]
    log.clear()
    assert len(log) == 0 and len(sim0.log) == len(sim1.log) == 0 and log.total_bytes_to_device == 0
    cm.disable_auto_cpu_offload()
    assert cm.offload_log is None


def test_the_pipeline_makes_its_latents_where_the_denoiser_runs(repos):
    """With models on several devices, a pipeline's execution device is its denoiser's (the largest model)."""
    pipe = tiny_sd_pipeline(repos[0], ComponentsManager())
    pipe.text_encoder._hf_hook = SimpleNamespace(execution_device=torch.device("meta"))
    assert pipe._execution_device == torch.device("meta")  # one device: the only hook's
    pipe.unet._hf_hook = SimpleNamespace(execution_device=torch.device("cpu"))
    pipe.vae._hf_hook = SimpleNamespace(execution_device=torch.device("meta"))
    assert pipe._execution_device == torch.device("cpu")


def test_the_denoisers_device_is_found_from_the_engines_sizes_without_walking_tensors(repos, monkeypatch):
    """Read at every step, the execution device over several devices compares the sizes the engines hold."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(repos[0], cm)
    cm.enable_auto_cpu_offload(device=two_devices(10**9), memory_reserve_margin=0)
    pipe.unet._hf_hook.device = torch.device("meta")  # its inputs go elsewhere: a second device
    monkeypatch.setattr(
        "modular.pipeline.devices.module_nbytes", lambda module: pytest.fail("walked a model's tensors")
    )
    assert pipe._execution_device == torch.device("meta")  # the unet's: the largest model
    cm.disable_auto_cpu_offload()


def test_each_models_source_files_are_read_once_when_it_is_attached_to_one_of_several_devices(monkeypatch):
    """Enabling over a device list, and adding a model after, ask ``weight_files`` once per model."""
    import components.offload_link

    asked = []
    weight_files = components.offload_link.weight_files
    monkeypatch.setattr(components.offload_link, "weight_files", lambda m: asked.append(m) or weight_files(m))
    cm = ComponentsManager()
    models = [sized(400), sized(800)]
    for index, model in enumerate(models):
        cm.add(f"m{index}", model)
    cm.enable_auto_cpu_offload(device=two_devices(10**6), memory_reserve_margin=0)
    assert sorted(map(id, asked)) == sorted(map(id, models))
    added = sized(400)
    cm.add("later", added)
    assert [m for m in asked if m is added] == [added]
    cm.disable_auto_cpu_offload()


# ---- bad input: a clear error, nothing changed ---------------------------------------------------------


def cuda_missing():
    return not torch.cuda.is_available()


BAD_LISTS = [
    pytest.param([], ValueError, r"device=\[\] names no device", id="empty"),
    pytest.param(
        [SimulatedDevice(5000), SimulatedDevice(5000)],
        ValueError,
        r"names \['sim'\] more than once.*give each SimulatedDevice its own name",
        id="duplicate-names",
    ),
    pytest.param(
        [SimulatedDevice(5000, name="a"), "cpu"], ValueError, r"entry 1 \('cpu'\) is the host", id="cpu"
    ),
    pytest.param(
        [SimulatedDevice(5000, name="a"), 3.5],
        TypeError,
        r"entry 1 \(3.5\): device must be",
        id="not-a-device",
    ),
    pytest.param(
        ["cuda:0", "cuda:1"],
        ValueError,
        r"entry 0 \('cuda:0'\): device 'cuda:0': torch.cuda.is_available\(\) is False",
        id="no-cuda",
        marks=pytest.mark.skipif(not cuda_missing(), reason="needs a machine without CUDA"),
    ),
]


@pytest.mark.parametrize(("devices", "error", "message"), BAD_LISTS)
def test_a_bad_device_list_is_refused_and_offload_left_as_it_was(devices, error, message):
    """A bad device list raises a clear error; the engine in place and its hooks stay."""
    cm = ComponentsManager()
    module = sized(1000)
    cm.add("model", module)
    cm.enable_auto_cpu_offload(device=SimulatedDevice(5000), memory_reserve_margin=0)
    before = cm.offload_engine
    with pytest.raises(error, match=message):
        cm.enable_auto_cpu_offload(device=devices, memory_reserve_margin=0)
    assert cm.offload_engines == [before] and module._hf_hook.engine is before


@pytest.mark.skipif(cuda_missing(), reason="needs CUDA")
def test_a_cuda_device_the_machine_lacks_or_a_mixed_list_is_refused():
    """A CUDA index past the device count, the same card twice, or simulated beside real devices: refused."""
    cm = ComponentsManager()
    cm.add("model", sized(1000))
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"this machine has {count} cuda device"):
        cm.enable_auto_cpu_offload(device=["cuda:0", f"cuda:{count}"])
    with pytest.raises(ValueError, match=r"names \['cuda:0'\] more than once"):
        cm.enable_auto_cpu_offload(device=["cuda", "cuda:0"])
    with pytest.raises(ValueError, match="mixes SimulatedDevice and real devices"):
        cm.enable_auto_cpu_offload(device=[SimulatedDevice(5000), "cuda:0"])
    assert not cm.auto_offload_enabled


def test_a_device_rule_that_answers_a_missing_device_is_refused():
    """A rule naming a device index not in the list raises StrategyError before any model is attached."""
    cm = ComponentsManager()
    module = sized(1000)
    model_id = cm.add("model", module)
    with pytest.raises(StrategyError, match=rf"bad indexes \{{'{model_id}': 7\}}"):
        cm.enable_auto_cpu_offload(device=two_devices(5000), offload_strategy=Nowhere())
    assert not cm.auto_offload_enabled and not hasattr(module, "_hf_hook")


def test_a_model_too_large_for_its_device_leaves_offload_as_it_was():
    """A model that cannot fit the device it is given raises ModelTooLargeError; nothing is attached."""
    cm = ComponentsManager()
    module = sized(8000)
    cm.add("model", module)
    with pytest.raises(ValueError, match="cannot fit"):
        cm.enable_auto_cpu_offload(device=two_devices(5000), memory_reserve_margin=0)
    assert not cm.auto_offload_enabled and not hasattr(module, "_hf_hook")


def test_a_strategy_one_device_refuses_leaves_every_device_with_its_old_one():
    """sim0 would take the watermarks, sim1 cannot (its model is over ``high``): neither changes."""
    cm = ComponentsManager()
    cm.add("big", sized(800))
    cm.add("small", sized(200))
    devices = [SimulatedDevice(400, name="sim0"), SimulatedDevice(900, name="sim1")]
    cm.enable_auto_cpu_offload(device=devices, memory_reserve_margin=0)
    sim0, sim1 = cm.offload_engines
    assert engine_placing(cm, cm.get_one(name="small")) is sim0
    assert engine_placing(cm, cm.get_one(name="big")) is sim1
    before = [engine.strategy for engine in (sim0, sim1)]
    with pytest.raises(ModelTooLargeError, match="big"):
        cm.set_offload_strategy(WatermarkStrategy(0.25, 0.5))
    assert [engine.strategy for engine in (sim0, sim1)] == before
    assert call(cm.get_one(name="big")).shape == (1, 1)  # still placed by the old strategy
