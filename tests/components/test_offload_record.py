"""`cm.offload_record`: the peer's record of auto offload (diffusers' newest manager), read from our log."""

import threading
from collections import deque

import pytest
import torch

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from offload import OffloadDecision, OffloadEngine, OffloadLog, OffloadRecord, SimulatedDevice, module_nbytes
from offload.records.offload_record import OFFLOAD_RECORD_MAXLEN

from ..modular.tiny_sd import tiny_sd_images, tiny_sd_pipeline
from ..offload.helpers import GROUP, Tower, X, call, sized


def manager(budget, sizes, **options):
    """A manager with auto offload on a simulated device of ``budget`` bytes, holding ``sized`` models."""
    cm = ComponentsManager()
    models = {name: sized(nbytes) for name, nbytes in sizes.items()}
    ids = {name: cm.add(name, model) for name, model in models.items()}
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve=0, **options)
    return cm, models, ids


def moves(record):
    return [(event.action, event.model_id, event.reason) for event in record.events]


class _OutOfMemoryOnce(torch.nn.Linear):
    """A 400-byte model whose first forward runs out of device memory."""

    def __init__(self):
        super().__init__(100, 1, bias=False)
        self.failures = 1

    def forward(self, x):
        if self.failures:
            self.failures -= 1
            raise torch.OutOfMemoryError("CUDA out of memory")
        return super().forward(x)


def test_an_eviction_is_an_offload_needed_by_the_model_that_came_in_then_its_onload():
    """Room for one of two 400-byte models: b's placement is one offload of a (``needed_by:<b>``) then b's
    onload, which carries the free bytes its decision saw, the model it offloaded and each model's size."""
    cm, models, ids = manager(600, {"a": 400, "b": 400})
    call(models["a"])
    call(models["b"])
    a, b = ids["a"], ids["b"]
    assert moves(cm.offload_record) == [
        ("onload", a, None),
        ("offload", a, f"needed_by:{b}"),
        ("onload", b, None),
    ]
    first, offload, second = cm.offload_record.events
    assert (first.available_memory, second.available_memory, offload.available_memory) == (600, 200, None)
    assert second.offloaded == (a,) and first.offloaded == ()
    assert [event.model_size for event in cm.offload_record.events] == [400, 400, 400]


def test_summary_counts_moves_and_bytes_and_the_most_models_on_the_device_at_once():
    """The peer's summary keys over the events: three onloads of 400 bytes, two offloads, no retry, at most
    one model resident (each evicts the other)."""
    cm, models, _ = manager(600, {"a": 400, "b": 400})
    for name in ("a", "b", "a"):
        call(models[name])
    assert cm.offload_record.summary() == {
        "onloads": 3,
        "offloads": 2,
        "bytes_onloaded": 1200,
        "bytes_offloaded": 800,
        "oom_retries": 0,
        "peak_co_residency": 1,
    }


def test_peak_co_residency_counts_models_resident_together_and_falls_with_an_offload():
    """With room for both, two models are resident at once; evicting one and placing it again stays at 2."""
    cm, models, ids = manager(1000, {"a": 400, "b": 400})
    call(models["a"])
    call(models["b"])
    assert cm.offload_record.summary()["peak_co_residency"] == 2
    cm.offload_engine.evict(ids["a"])
    call(models["a"])
    assert moves(cm.offload_record)[-2:] == [("offload", ids["a"], "evict"), ("onload", ids["a"], None)]
    assert cm.offload_record.summary()["peak_co_residency"] == 2


def test_an_out_of_memory_retry_is_an_oom_event_then_the_offloads_it_caused():
    """A forward out of memory once: an ``oom`` event for it, then the offload of the other model with reason
    ``oom_retry:<id>``; ``oom_retries`` counts it."""
    cm = ComponentsManager()
    other, flaky = sized(100), _OutOfMemoryOnce()
    other_id, flaky_id = cm.add("other", other), cm.add("flaky", flaky)
    cm.enable_auto_cpu_offload(device=SimulatedDevice(1000), memory_reserve=0)
    call(other)
    flaky(torch.ones(1, 100))
    assert moves(cm.offload_record) == [
        ("onload", other_id, None),
        ("onload", flaky_id, None),
        ("oom", flaky_id, None),
        ("offload", other_id, f"oom_retry:{flaky_id}"),
    ]
    assert cm.offload_record.summary()["oom_retries"] == 1
    assert cm.offload_record.summary()["bytes_offloaded"] == 100


def test_events_hold_the_newest_up_to_the_bound_set_by_maxlen():
    """The bound is ``OFFLOAD_RECORD_MAXLEN`` (10 000, the peer's); ``maxlen`` keeps the newest n and
    ``dropped`` says how many went. A bound that is not a positive int is refused, the bound left as it was."""
    cm, models, ids = manager(600, {"a": 400, "b": 400})
    assert cm.offload_record.maxlen == OFFLOAD_RECORD_MAXLEN == 10_000
    for name in ("a", "b", "a", "b"):
        call(models[name])  # 7 events: 4 onloads, 3 offloads
    cm.offload_record.maxlen = 2
    assert moves(cm.offload_record) == [
        ("offload", ids["a"], f"needed_by:{ids['b']}"),
        ("onload", ids["b"], None),
    ]
    assert len(cm.offload_record) == 2 and cm.offload_record.dropped == 5
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            cm.offload_record.maxlen = bad
    assert cm.offload_record.maxlen == 2
    cm.offload_record.maxlen = 3
    assert len(cm.offload_record.events) == 3


def test_an_empty_deque_given_to_events_empties_the_record_and_bounds_it_as_the_peers_tests_do():
    """The peer's tests replace ``events`` by an empty ``deque(maxlen=n)``: here that clears the record (and
    the log) and sets the bound, so the moves after it fill it up to n. Any other value is refused and the
    record is left as it was."""
    cm, models, ids = manager(600, {"a": 400, "b": 400})
    call(models["a"])
    with pytest.raises(TypeError, match="only its bound can be set"):
        cm.offload_record.events = deque(cm.offload_record.events, maxlen=5)
    with pytest.raises(TypeError, match="only its bound can be set"):
        cm.offload_record.events = []
    assert len(cm.offload_record) == 1 and cm.offload_record.maxlen == OFFLOAD_RECORD_MAXLEN
    cm.offload_record.events = deque(maxlen=2)
    assert cm.offload_record.maxlen == 2 and len(cm.offload_record) == 0
    for name in ("b", "a"):
        call(models[name])
    assert moves(cm.offload_record) == [
        ("offload", ids["b"], f"needed_by:{ids['a']}"),
        ("onload", ids["a"], None),
    ]


def test_decisions_the_log_let_go_count_as_dropped():
    """The log's own bound: a record over a log holding 2 decisions of 3 says at least one event went."""
    log = OffloadLog(maxlen=2)
    record = OffloadRecord()
    record.follow(log)
    for name in ("a", "b", "c"):
        log.append(OffloadDecision(0.0, name, (), 100, 0, 1000, 900, "fits", sizes=(100,)))
    assert log.dropped == 1 and len(record) == 2 and record.dropped == 1


def test_clear_clears_the_offload_log_too_one_record():
    """``clear()`` empties the record and ``cm.offload_log`` (decisions and totals): they are one record.
    The next move is recorded in both."""
    cm, models, ids = manager(600, {"a": 400, "b": 400})
    call(models["a"])
    call(models["b"])
    cm.offload_record.clear()
    assert len(cm.offload_record) == 0 and len(cm.offload_log) == 0
    assert cm.offload_log.total_bytes_to_device == 0 and cm.offload_log.total_evictions == 0
    assert repr(cm.offload_record) == "offload record: nothing recorded yet"
    call(models["a"])
    assert moves(cm.offload_record) == [
        ("offload", ids["b"], f"needed_by:{ids['a']}"),
        ("onload", ids["a"], None),
    ]
    assert len(cm.offload_log) == 1


def test_the_record_is_kept_after_disable_and_starts_afresh_when_enabled_again():
    """After ``disable_auto_cpu_offload()`` the record still holds the run, its resident model offloaded with
    reason ``offloading_disabled``, while ``offload_log`` is None; enabling again starts an empty record,
    which then records the new engine's moves."""
    cm, models, ids = manager(1000, {"a": 400})
    call(models["a"])
    cm.disable_auto_cpu_offload()
    assert cm.offload_log is None
    assert moves(cm.offload_record) == [
        ("onload", ids["a"], None),
        ("offload", ids["a"], "offloading_disabled"),
    ]
    assert cm.offload_record.summary()["onloads"] == 1
    cm.enable_auto_cpu_offload(device=SimulatedDevice(1000), memory_reserve=0)
    assert len(cm.offload_record) == 0
    call(models["a"])
    assert moves(cm.offload_record) == [("onload", ids["a"], None)]
    cm.disable_auto_cpu_offload()
    cm.disable_auto_cpu_offload()  # a second disable changes nothing
    assert cm.offload_record.summary()["offloads"] == 1


def test_an_empty_record_before_offload_is_on():
    cm = ComponentsManager()
    assert len(cm.offload_record) == 0 and cm.offload_record.summary()["onloads"] == 0
    assert str(cm.offload_record) == "offload record: nothing recorded yet"
    cm.offload_record.clear()  # nothing to clear: no error


def test_a_removed_model_keeps_its_events_and_its_removal_is_an_offload():
    """Removing a resident model offloads it (``component_removed``); its earlier events stay, with its size,
    after the manager forgot it."""
    cm, models, ids = manager(1000, {"a": 400, "b": 200})
    call(models["a"])
    call(models["b"])
    cm.remove(ids["a"])
    assert moves(cm.offload_record) == [
        ("onload", ids["a"], None),
        ("onload", ids["b"], None),
        ("offload", ids["a"], "component_removed"),
    ]
    assert [event.model_size for event in cm.offload_record.events] == [400, 200, 400]
    assert ids["a"] in str(cm.offload_record)


def test_the_printed_table_has_a_row_per_decision_and_the_summary():
    """Exact text: one row per onload with the models it offloaded, the free bytes before it and its reason;
    another offload on its own row; then the peer's summary."""
    engine = OffloadEngine(SimulatedDevice(600), memory_reserve_margin=0)
    record = OffloadRecord()
    record.follow(engine.log)
    modules = {"a": sized(400), "b": sized(400)}
    for name, module in modules.items():
        engine.attach(name, module)
    call(modules["a"])
    call(modules["b"])
    engine.evict("b")
    assert str(record) == "\n".join(
        [
            "# | onload    | offloaded | free before | reason",
            "------------------------------------------------",
            "1 | a (400 B) | -         | 600 B       |",
            "2 | b (400 B) | a (400 B) | 200 B       |",
            "3 | -         | b (400 B) | -           | evict",
            "------------------------------------------------",
            "2 onloads (800 B), 2 offloads (800 B), 0 out-of-memory retries, peak co-residency 1",
        ]
    )


def test_a_shrunk_victim_is_an_offload_that_still_counts_as_resident():
    """A victim kept down to a resident prefix (our ``shrink``) is an offload with reason ``shrink``; its
    prefix stays on the device, so the peak counts it beside the model placed next to it."""
    engine = OffloadEngine(SimulatedDevice(9 * GROUP), memory_reserve_margin=0)
    engine.shrink_victims = True
    record = OffloadRecord()
    record.follow(engine.log)
    models = {"encoder": Tower(depth=5, seed=1), "a": Tower(depth=5, seed=2)}
    for model_id, model in models.items():
        engine.attach(model_id, model)
    engine.set_plan(["encoder", "a"])
    models["encoder"](X)
    models["a"](X)
    assert moves(record) == [
        ("onload", "encoder", None),
        ("offload", "encoder", "shrink"),
        ("onload", "a", None),
    ]
    assert record.summary()["peak_co_residency"] == 2


def test_several_devices_name_each_events_device_and_the_peak_is_per_device():
    """With two devices, each event names its device; the peak is the most models on one device."""
    cm = ComponentsManager()
    models = {name: sized(400) for name in ("a", "b")}
    for name, model in models.items():
        cm.add(name, model)
    devices = [SimulatedDevice(500, name="sim0"), SimulatedDevice(500, name="sim1")]
    cm.enable_auto_cpu_offload(device=devices, memory_reserve=0)
    call(models["a"])
    call(models["b"])
    assert sorted(event.device for event in cm.offload_record.events) == ["sim0", "sim1"]
    assert cm.offload_record.summary()["peak_co_residency"] == 1
    assert str(cm.offload_record).startswith("# | device | onload")
    cm.disable_auto_cpu_offload()
    assert cm.offload_record.summary()["offloads"] == 2  # kept, both devices


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repos")
    return make_tiny_repo(folder / "a"), make_tiny_repo(folder / "b")


def test_two_threads_running_pipelines_record_every_move_once(repos):
    """Two pipelines in two threads on one device with room for one pipeline's models: every decision of the
    log is in the record, in the log's order, and the summary agrees with the log's totals."""
    cm = ComponentsManager()
    pipes = [tiny_sd_pipeline(repo, cm) for repo in repos]
    budget = sum(module_nbytes(m) for m in (pipes[0].unet, pipes[0].text_encoder, pipes[0].vae))
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve=0)
    errors = []

    def work(pipe):
        try:
            for _ in range(2):
                tiny_sd_images(pipe)
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(pipe,)) for pipe in pipes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    summary = cm.offload_record.summary()
    log = cm.offload_log
    placing = ("fits", "stream", "prefetch", "pinned")
    placed = [d for d in log if d.reason in placing or d.reason.startswith("evict: ")]
    assert summary["onloads"] == len(placed) and summary["offloads"] == log.total_left_device > 0
    assert summary["bytes_onloaded"] == sum(d.sizes[0] for d in placed)
    onloads = [event.model_id for event in cm.offload_record.events if event.action == "onload"]
    assert onloads == [d.model_id for d in placed]
    assert 2 <= summary["peak_co_residency"] <= 6  # six models; the device holds one pipeline's three
    cm.disable_auto_cpu_offload()


def test_clear_during_a_run_in_another_thread_keeps_record_and_log_consistent():
    """A thread runs two models that evict each other while the main thread clears the record again and
    again: no error, and after the run every event of the record comes from a decision the log holds."""
    cm, models, _ = manager(600, {"a": 400, "b": 400})
    stop = threading.Event()
    errors = []

    def work():
        try:
            while not stop.is_set():
                call(models["a"])
                call(models["b"])
        except Exception as error:  # reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    try:
        for _ in range(200):
            cm.offload_record.clear()
            cm.offload_record.summary()
            str(cm.offload_record)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    log = cm.offload_log
    assert log.dropped == 0
    assert cm.offload_record.summary()["onloads"] == len(log)
    assert log.total_bytes_to_device == 400 * len(log) == cm.offload_record.summary()["bytes_onloaded"]


def test_a_refused_enable_leaves_the_record_as_it_was_and_a_new_enable_starts_afresh():
    """An enable refused (a model larger than the device) changes nothing: the record still reads the
    running engine's log. Enabling again while on replaces the engine, and the record starts empty."""
    cm, models, ids = manager(1000, {"a": 400})
    call(models["a"])
    before = list(cm.offload_record.events)
    with pytest.raises(ValueError, match="a_"):
        cm.enable_auto_cpu_offload(device=SimulatedDevice(100), memory_reserve=0)
    assert list(cm.offload_record.events) == before and cm.auto_offload_enabled
    cm.enable_auto_cpu_offload(device=SimulatedDevice(1000), memory_reserve=0)
    assert len(cm.offload_record) == 0
    call(models["a"])
    assert moves(cm.offload_record) == [("onload", ids["a"], None)]
