"""The running totals and indexes the hot paths read equal the sums and walks they replace, after any sequence
of attaches, detaches, calls, evictions, shrinks, streams, host-budget drops, changes of size and threads."""

import random
import tempfile
import threading

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from offload import ModelTooLargeError, OffloadEngine, SimulatedDevice
from offload.host.host_tier import _in_memory
from offload.weights.ledger import _held

from .helpers import Tower, call, sized

SIZE = 256  # bytes of a small model; a Tower is larger than the device and streams
TOWER = sum(p.nbytes for p in Tower(depth=4, width=8).parameters())  # five groups of 288 bytes


def check_totals(engine: OffloadEngine) -> None:
    """Each running total and index equals what walking every attached model finds."""
    ledger, tier, probe = engine._ledger, engine.host_tier, engine.probe
    entries = ledger._entries
    walked = {mid: _held(e) for mid, e in entries.items() if e.resident and e.pinned is None}
    assert list(ledger.residents().items()) == list(walked.items())  # the same order too
    assert ledger.pinned() == {mid: e.pinned for mid, e in entries.items() if e.pinned is not None}
    assert {mid: ledger.id_of(e.module) for mid, e in entries.items()} == {mid: mid for mid in entries}
    assert ledger.resident_bytes() == sum(walked.values())  # pinned bytes are the probe's alone
    assert tier.held_bytes() == sum(_in_memory(model) for model in tier._models.values())
    assert tier.placed_bytes() == sum(model.size for model in tier._models.values())
    assert probe.used_bytes() == sum(probe._resident.values())


def operation(engine: OffloadEngine, modules: dict, step: tuple) -> None:
    kind, pick = step
    attached = engine.attached_ids()
    target = attached[pick % len(attached)] if attached else None
    if kind == "attach":  # a small model (of two sizes), a tower that streams, or (pick 5) a pinned one
        model_id = f"m{len(modules)}"
        modules[model_id] = (
            Tower(depth=4, seed=pick, width=8) if pick % 4 == 0 else sized(SIZE * (1 + pick % 2))
        )
        engine.attach(model_id, modules[model_id], pinned=pick == 5)
    elif target is None:
        return
    elif kind == "call":
        module = modules[target]
        module(torch.ones(1, 8)) if isinstance(module, Tower) else call(module)
    elif kind == "evict":
        engine.evict(target)
    elif kind == "detach":
        engine.detach(target, read_back=pick % 2 == 0)
    elif kind == "grow":  # a change of size, measured again at the next call (or refreshed now)
        module = modules[target]
        if isinstance(module, torch.nn.Linear):
            module.weight = torch.nn.Parameter(torch.ones(2, module.in_features))
            if pick % 2:
                engine.refresh_host_copy(target)
    elif kind == "shrink":
        engine.shrink_victims = pick % 2 == 0


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["attach"] * 3 + ["call"] * 5 + ["evict", "detach", "grow", "shrink"]),
        st.integers(0, 7),
    ),
    min_size=6,
    max_size=24,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, host_budget=st.sampled_from([None, 2 * SIZE, 4 * SIZE]))
def test_the_running_totals_equal_the_sums_after_any_sequence(steps, host_budget):
    """After every step, under a host budget that drops copies to disk or none, totals equal recomputed sums."""
    with tempfile.TemporaryDirectory() as spill:
        budget = None if host_budget is None else max(host_budget, TOWER)  # every model fits the host budget
        engine = OffloadEngine(
            SimulatedDevice(3 * SIZE), memory_reserve_margin=0, host_budget=budget, spill_folder=spill
        )
        modules: dict = {}
        try:
            for step in steps:
                try:
                    operation(engine, modules, step)
                except ModelTooLargeError:
                    pass  # refused (pinned models took the room): nothing changed, which the totals say too
                check_totals(engine)
            for reason in {decision.reason.split(":")[0] for decision in engine.log}:
                event(reason)  # what the sequences reach: --hypothesis-show-statistics
        finally:
            engine.close()
        check_totals(engine)
        assert engine.host_tier.held_bytes() == engine.host_tier.placed_bytes() == 0


def test_the_running_totals_hold_after_calls_from_several_threads(tmp_path):
    """Four threads call eight models on a device that holds three, under a host budget that drops copies."""
    engine = OffloadEngine(
        SimulatedDevice(3 * SIZE), memory_reserve_margin=0, host_budget=4 * SIZE, spill_folder=tmp_path
    )
    modules = [sized(SIZE) for _ in range(8)]
    for index, module in enumerate(modules):
        engine.attach(f"m{index}", module)
    expected = [call(module) for module in modules]
    errors = []

    def worker(seed):
        chooser = random.Random(seed)
        try:
            for _ in range(30):
                index = chooser.randrange(len(modules))
                assert torch.equal(call(modules[index]), expected[index])
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    check_totals(engine)
    assert any(decision.reason == "drop host copy" for decision in engine.log)
    engine.close()
