"""The engine's per-call work does not grow with the models attached: running totals and indexes, not walks.

Counted in lines run (``lines_run``), never timed; ``benchmarks/manager_scale.py`` times the same paths.
"""

import pytest
import torch

from offload import OffloadEngine, SimulatedDevice

from .helpers import call, lines_run, sized

SIZE = 64  # bytes of each model
FEW, MANY = 10, 300


def engine_of(count: int, **options) -> tuple[OffloadEngine, list[torch.nn.Module]]:
    """An engine whose device holds four models, with ``count`` models attached (none placed yet)."""
    engine = OffloadEngine(SimulatedDevice(4 * SIZE), memory_reserve_margin=0, **options)
    modules = [sized(SIZE) for _ in range(count)]
    for index, module in enumerate(modules):
        engine.attach(f"m{index}", module)
    return engine, modules


def call_each(modules: list[torch.nn.Module]) -> None:
    for module in modules:
        call(module)


def test_a_hooked_call_of_a_resident_model_runs_the_same_lines_beside_10_or_300_models():
    """With the host copies' total kept as they change, a call of a placed model looks at no other model."""
    counts = []
    for count in (FEW, MANY):
        engine, modules = engine_of(count)
        call(modules[0])
        counts.append(lines_run(call, modules[0]))
        assert engine.resident_ids() == ["m0"]
    assert counts[0] == counts[1]


def test_a_hooked_call_that_evicts_runs_the_same_lines_beside_10_or_300_models():
    """Five models take turns on a device that holds four: each call evicts one, found among the residents
    (an index), not among every attached model."""
    counts = []
    for count in (FEW, MANY):
        engine, modules = engine_of(count)
        turns = modules[:5]
        for module in turns:
            call(module)
        before = len(engine.log)
        counts.append(lines_run(call_each, turns))
        assert all(decision.evicted for decision in list(engine.log)[before:])
    assert counts[0] == counts[1]


def test_attaching_and_detaching_a_model_run_the_same_lines_beside_10_or_300_models():
    """Attach finds a module attached under another id in an index; so attaching all is linear."""
    counts = []
    for count in (FEW, MANY):
        engine, _ = engine_of(count)
        module = sized(SIZE)
        attach = lines_run(engine.attach, "new", module)
        detach = lines_run(engine.detach, "new")
        counts.append((attach, detach))
        assert not engine.has_hook("new")
    assert counts[0] == counts[1]


def test_a_module_attached_twice_is_still_refused_by_its_first_id():
    """The index answers what the walk did: one module, one id; a detached one can come back under another."""
    engine, modules = engine_of(3)
    with pytest.raises(ValueError) as error:
        engine.attach("again", modules[1])
    assert (
        str(error.value)
        == "this module is already attached as 'm1'; one module can be attached under one id only."
    )
    engine.detach("m1")
    engine.attach("again", modules[1])
    assert engine.attached_ids() == ["m0", "m2", "again"]
